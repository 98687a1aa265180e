"""PyTorch's FlashAttention varlen kernel, `torch.nn.attention.varlen.varlen_attn`, on every release that has it.

The function changed its signature in each release since it appeared (read from each release's
`torch/nn/attention/varlen.py`, in the wheels of torch 2.10.0, 2.11.0, 2.12.0 and 2.13.0):
- 2.10: `varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None)`: no `scale`
  (always 1/sqrt(head_dim)), no windows, and q, k, v must have the same number of heads.
- 2.11: keyword-only `scale` and `window_size=(left, right)`; causality is spelled `window_size=(-1, 0)` (the
  function derives `is_causal = window_size == (-1, 0)`), and there is still no GQA argument.
- 2.12 and 2.13: adds `enable_gqa` (plus `seqused_k`, `block_table`, `num_splits` for inference) and refuses
  different head counts without it.
`VarlenKernel` reads the signature once and gives the rest of the code one call: causal attention over packed
segments, optionally in a sliding window, with GQA, any scale and a value head dim different from the query's.
What a version lacks is made up exactly (repeated k/v heads, a pre-scaled query, zero-padded head dims) or, for
windows on 2.10, reported by `takes_window` so the caller can use its SDPA path instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Callable

import torch
import torch.nn.functional as F

try:  # CUDA only; absent before torch 2.10
    from torch.nn.attention.varlen import varlen_attn as _installed_varlen_attn
except ImportError:
    _installed_varlen_attn = None

# FlashAttention 2 handles head dims up to 256, in multiples of 8 (the kernel pads odd sizes itself, but padding
# here with zeros is exact and keeps every version on its fast path).
MAX_HEAD_DIM = 256
_HEAD_DIM_MULTIPLE = 8


@dataclasses.dataclass(frozen=True)
class VarlenKernel:
    """One installed `varlen_attn` and which of the later keyword arguments it takes."""

    function: Callable
    takes_is_causal: bool  # 2.10
    takes_scale: bool  # 2.11+
    takes_window: bool  # 2.11+
    takes_enable_gqa: bool  # 2.12+

    @classmethod
    def of(cls, function: Callable) -> "VarlenKernel | None":
        """The adapter for this signature, or None when it has no way to ask for causal attention."""
        parameters = inspect.signature(function).parameters
        kernel = cls(function, "is_causal" in parameters, "scale" in parameters, "window_size" in parameters,
                     "enable_gqa" in parameters)
        return kernel if kernel.takes_is_causal or kernel.takes_window else None

    def describe(self) -> str:
        """What this version does natively and what the adapter adds, for the capability table."""
        native = [name for name, present in (("scale", self.takes_scale), ("window_size", self.takes_window),
                                              ("enable_gqa", self.takes_enable_gqa)) if present]
        added = []
        if not self.takes_enable_gqa:
            added.append("GQA by repeating k/v heads")
        if not self.takes_scale:
            added.append("scale folded into q")
        if not self.takes_window:
            added.append("sliding windows on per-segment SDPA")
        text = f"torch {torch.__version__} varlen_attn ({', '.join(native) if native else 'is_causal only'})"
        return text + (f"; {', '.join(added)}" if added else "")

    def padded_head_dim(self, query_head_dim: int, value_head_dim: int) -> int:
        return _HEAD_DIM_MULTIPLE * math.ceil(max(query_head_dim, value_head_dim) / _HEAD_DIM_MULTIPLE)

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                 max_length: int, *, scale: float, window: int | None = None) -> torch.Tensor:
        """Causal attention within each segment of the token axis.

        query (T, Hq, Dqk), key (T, Hkv, Dqk), value (T, Hkv, Dv) in one half dtype; `cu_seqlens` int32 (n + 1,);
        `window`: keys each query sees, itself included (transformers' `sliding_window`), or None for all earlier
        ones. Returns (T, Hq, Dv).
        """
        if window is not None and not self.takes_window:
            raise ValueError("this varlen_attn takes no window_size; check `takes_window` before asking for one")
        q_heads, kv_heads = query.shape[1], key.shape[1]
        value_head_dim = value.shape[-1]
        head_dim = self.padded_head_dim(query.shape[-1], value_head_dim)
        query, key, value = (F.pad(t, (0, head_dim - t.shape[-1])) for t in (query, key, value))
        kwargs = {}
        if self.takes_scale:
            kwargs["scale"] = scale
        else:  # the kernel multiplies by 1/sqrt(head_dim) of what it is given: fold the wanted scale into q
            query = query * (scale * math.sqrt(head_dim))
        if q_heads != kv_heads:
            if self.takes_enable_gqa:
                kwargs["enable_gqa"] = True
            else:  # transformers' repeat_kv order: query head h reads key/value head h // (q_heads // kv_heads)
                key = key.repeat_interleave(q_heads // kv_heads, dim=1)
                value = value.repeat_interleave(q_heads // kv_heads, dim=1)
        if self.takes_window:
            # flash's (left, right) counts keys before and after the query: a window of W keys is (W - 1, 0).
            kwargs["window_size"] = (-1, 0) if window is None else (window - 1, 0)
            out = self.function(query, key, value, cu_seqlens, cu_seqlens, max_length, max_length, **kwargs)
        else:
            out = self.function(query, key, value, cu_seqlens, cu_seqlens, max_length, max_length, True, **kwargs)
        return out[..., :value_head_dim]


INSTALLED = VarlenKernel.of(_installed_varlen_attn) if _installed_varlen_attn is not None else None


def absence_reason() -> str:
    """Why there is no kernel to use here (for the capability table)."""
    if _installed_varlen_attn is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (added in 2.10)"
    return f"torch {torch.__version__}'s varlen_attn has a signature this code does not know"
