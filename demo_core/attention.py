"""Attention paths for packed rows: our varlen attention, backend choice and the capability table.

transformers' built-in packed path on sdpa/eager builds a dense (T, T) block-diagonal mask over the whole packed
row, so it pays (Σ sᵢ)² for attention and can end up slower than padding. `varlen_attention` pays Σ sᵢ²: it finds
the segments (from the collator's `cu_seq_lens_q`, else from `position_ids` restarts, plus a right- or left-padded
2-D mask) and attends within each one:
- CUDA in half precision (bf16/fp16 tensors, or fp32 tensors under a bf16/fp16 autocast) with PyTorch's
  `torch.nn.attention.varlen.varlen_attn`: one FlashAttention varlen call over the real tokens, no flash-attn build.
- elsewhere: SDPA with `is_causal=True` over buckets of similar-length segments, each right-padded to the bucket's
  longest. Causality makes that padding harmless: a real query at position i only sees keys 0..i, which are real.
  Buckets keep the Python overhead to a few SDPA calls per layer instead of one per example.
It is registered with transformers' `AttentionInterface` under the name "varlen", and with its
`AttentionMaskInterface` so that a padded batch's 2-D mask reaches it (transformers drops the mask for attention
names it has no mask function for, which would silently attend to left padding).
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, PretrainedConfig
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
from transformers.utils import is_flash_attn_2_available

from .errors import DemoInputError

try:  # the FlashAttention varlen kernel inside PyTorch (CUDA only); absent from older PyTorch builds
    from torch.nn.attention.varlen import varlen_attn as _torch_varlen_attn
except ImportError:
    _torch_varlen_attn = None

VARLEN = "varlen"
# A bucket takes every segment within 25% or 16 tokens of its longest: padding a bucket then costs at most
# 1.25² ≈ 1.6x its attention FLOPs, while FLAN-like lengths (24..1024 tokens) need ~15 SDPA calls per layer.
# Measured on 2 CPU cores (tiny-llama, flan-like): attention is ~15% of a step, gathers ~7%; see docs/RESULTS.md.
_BUCKET_SLACK_RATIO = 1.25
_BUCKET_SLACK_TOKENS = 16


@dataclasses.dataclass
class Bucket:
    """Segments of similar length attended in one SDPA call, each right-padded to `gather_index.shape[1]`."""

    gather_index: torch.Tensor  # (n, L) token-axis positions; padding entries repeat the segment's last token
    keep_index: torch.Tensor  # positions in the flattened (n * L) bucket output that are real tokens


@dataclasses.dataclass
class Segments:
    """Where each attended segment lies in the flattened (batch * seq) token axis."""

    lengths: list[int]
    buckets: list[Bucket]
    real_index: torch.Tensor  # all real token positions, segment by segment
    bucket_destination: torch.Tensor  # token-axis position of each kept bucket output, buckets concatenated
    cu_seqlens: torch.Tensor  # int32 (n_segments + 1,) over `real_index`
    all_real: bool  # no padding anywhere: gathers and scatters over the whole token axis can be skipped

    @property
    def max_length(self) -> int:
        return max(self.lengths)


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def _segment_start_flags(batch: int, seq_len: int, attention_mask, position_ids, cu_seq_lens) -> tuple:
    """(real, starts): (batch, seq) bool arrays, which slots hold real tokens and which begin a segment."""
    starts = np.zeros((batch, seq_len), dtype=bool)
    starts[:, 0] = True
    if cu_seq_lens is not None and batch == 1:
        bounds = _as_numpy(cu_seq_lens).astype(np.int64)
        if bounds[-1] != seq_len:
            raise DemoInputError(f"cu_seq_lens ends at {bounds[-1]} but the packed row has {seq_len} tokens")
        starts[0, bounds[:-1][bounds[:-1] < seq_len]] = True  # an empty last segment starts nowhere
    elif position_ids is not None:
        # transformers' own packing rule: a new sequence starts wherever the position does not continue by one.
        positions = np.broadcast_to(_as_numpy(position_ids), (batch, seq_len))
        starts[:, 1:] |= positions[:, 1:] != positions[:, :-1] + 1
    if attention_mask is None:
        return np.ones((batch, seq_len), dtype=bool), starts
    real = _as_numpy(attention_mask).astype(bool)
    run_starts = real.copy()
    run_starts[:, 1:] &= ~real[:, :-1]
    rows_with_holes = np.flatnonzero(run_starts.sum(axis=1) > 1)
    if rows_with_holes.size:
        raise DemoInputError(
            f"varlen attention got an attention mask with holes in row {rows_with_holes[0]}: it only honours "
            f"padding at the start or end of a row; use --attention sdpa for arbitrary masks"
        )
    return real, (starts | run_starts) & real


def _buckets(starts: np.ndarray, lengths: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(gather index, keep index) per bucket. Greedy over lengths sorted longest first: each bucket takes the next
    run of segments within the slack of its longest."""
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]
    buckets, first = [], 0
    while first < len(order):
        longest = int(sorted_lengths[first])
        shortest_allowed = min(longest / _BUCKET_SLACK_RATIO, longest - _BUCKET_SLACK_TOKENS)
        # sorted_lengths descends, so the members are a contiguous run starting at `first`
        last = first + int(np.count_nonzero(sorted_lengths[first:] >= shortest_allowed))
        members = order[first:last]
        offsets = np.arange(longest)
        bucket_lengths = lengths[members][:, None]
        # Padding entries repeat the segment's last token: any valid index works, causality hides them.
        gather_index = starts[members][:, None] + np.minimum(offsets[None, :], bucket_lengths - 1)
        buckets.append((gather_index, np.flatnonzero(offsets[None, :] < bucket_lengths)))
        first = last
    return buckets



def bucket_shapes(lengths: list[int]) -> list[tuple[int, int]]:
    """(segments, padded length) of each SDPA call the CPU path makes for these segment lengths (memory estimate)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return [gather.shape for gather, _ in _buckets(np.zeros(len(lengths), dtype=np.int64), lengths)]

def find_segments(batch: int, seq_len: int, device: torch.device, attention_mask=None, position_ids=None,
                  cu_seq_lens=None) -> Segments:
    """Segments from, in order of trust: `cu_seq_lens` (one packed row), `position_ids` restarts, the 2-D mask.

    Index bookkeeping runs in NumPy: these are small integer arrays, and torch would hand each op to its OpenMP
    pool, whose synchronisation costs milliseconds per op on a busy 2-core machine (measured: 10x slower).
    """
    real, starts = _segment_start_flags(batch, seq_len, attention_mask, position_ids, cu_seq_lens)
    real_index = np.flatnonzero(real)
    if real_index.size == 0:
        raise DemoInputError("varlen attention got a batch without any real token")
    # Every segment is a contiguous run of real slots (a padding gap always ends one), so segment k spans
    # real_index[first_k : first_k + length_k].
    first_in_real = np.flatnonzero(starts.reshape(-1)[real_index])
    lengths = np.diff(first_in_real, append=real_index.size)
    buckets = _buckets(real_index[first_in_real], lengths)
    bucket_destination = np.concatenate([gather.reshape(-1)[keep] for gather, keep in buckets])
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)

    def on_device(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    return Segments(
        lengths=lengths.tolist(),
        buckets=[Bucket(on_device(gather), on_device(keep)) for gather, keep in buckets],
        real_index=on_device(real_index),
        bucket_destination=on_device(bucket_destination),
        cu_seqlens=on_device(cu_seqlens),
        all_real=real_index.size == batch * seq_len,
    )


class _SegmentCache(threading.local):
    """Every layer of one forward gets the same kwargs tensors: find the segments once per forward, not per layer.

    Keyed on tensor identity (the cache holds the tensors, so an id cannot be reused while cached); thread-local
    because the app may run two bursts at once.
    """

    def __init__(self):
        self.key: tuple | None = None
        self.segments: Segments | None = None

    def get(self, batch, seq_len, device, attention_mask, position_ids, cu_seq_lens) -> Segments:
        key = (batch, seq_len, str(device), attention_mask, position_ids, cu_seq_lens)
        if self.key is None or self.key[:3] != key[:3] or any(a is not b for a, b in zip(self.key[3:], key[3:])):
            self.segments = find_segments(batch, seq_len, device, attention_mask, position_ids, cu_seq_lens)
            self.key = key
        return self.segments


_cache = _SegmentCache()


def _flash_dtype(query: torch.Tensor, dropout_p: float) -> torch.dtype | None:
    """The half dtype PyTorch's varlen kernel should run in here, or None when it cannot run."""
    if _torch_varlen_attn is None or not query.is_cuda or dropout_p > 0.0:
        return None
    if query.dtype in (torch.float16, torch.bfloat16):
        return query.dtype
    # Trainer's bf16/fp16 keeps fp32 weights under autocast, and RoPE promotes q/k back to fp32: cast as
    # transformers' own flash path does, or the kernel would never run in a mixed-precision burst.
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    return None


def _flash_varlen(q_tokens, k_tokens, v_tokens, segments: Segments, scaling, dtype: torch.dtype) -> torch.Tensor:
    """PyTorch's FlashAttention varlen kernel over the real tokens; (B*T, Hq, D) out, zeros on padding."""
    if segments.all_real:
        q_real, k_real, v_real = q_tokens, k_tokens, v_tokens
    else:
        index = segments.real_index
        q_real, k_real, v_real = q_tokens[index], k_tokens[index], v_tokens[index]
    out_real = _torch_varlen_attn(
        q_real.to(dtype), k_real.to(dtype), v_real.to(dtype), segments.cu_seqlens, segments.cu_seqlens,
        segments.max_length, segments.max_length, scale=scaling, window_size=(-1, 0),
        enable_gqa=q_tokens.shape[1] != k_tokens.shape[1],
    )
    if segments.all_real:
        return out_real
    return out_real.new_zeros(q_tokens.shape).index_copy(0, segments.real_index, out_real)


def _bucketed_sdpa(q_tokens, k_tokens, v_tokens, segments: Segments, scaling, dropout_p: float) -> torch.Tensor:
    """Causal SDPA per bucket of similar-length segments; (B*T, Hq, D) out, zeros on padding."""
    gqa = q_tokens.shape[1] != k_tokens.shape[1]
    outputs = []
    for bucket in segments.buckets:
        index = bucket.gather_index
        # (n, L, H, D) -> (n, H, L, D) for SDPA
        out = F.scaled_dot_product_attention(
            q_tokens[index].transpose(1, 2), k_tokens[index].transpose(1, 2), v_tokens[index].transpose(1, 2),
            is_causal=True, scale=scaling, dropout_p=dropout_p, enable_gqa=gqa,
        )
        n, heads, length, head_dim = out.shape
        outputs.append(out.transpose(1, 2).reshape(n * length, heads, head_dim).index_select(0, bucket.keep_index))
    kept = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    if segments.all_real:  # every slot is written exactly once: no need to zero the output first
        return torch.empty_like(kept).index_copy(0, segments.bucket_destination, kept)
    return kept.new_zeros(q_tokens.shape).index_copy(0, segments.bucket_destination, kept)


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function: q (B, Hq, T, D), k/v (B, Hkv, T, D) -> ((B, T, Hq, D), None)."""
    if kwargs.get("softcap") is not None:
        raise DemoInputError("varlen attention does not implement logit soft-capping (Gemma 2); use eager")
    if not getattr(module, "is_causal", True):
        raise DemoInputError("varlen attention is causal only; this layer attends bidirectionally")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise DemoInputError("varlen attention takes a 2-D padding mask or none; got a prepared 4-D mask")
    batch, q_heads, seq_len, head_dim = query.shape
    kv_heads = key.shape[1]
    segments = _cache.get(batch, seq_len, query.device, attention_mask, kwargs.get("position_ids"),
                          kwargs.get("cu_seq_lens_q"))
    window = kwargs.get("sliding_window")
    if window is not None and segments.max_length > window:
        raise DemoInputError(f"a segment of {segments.max_length} tokens exceeds the model's sliding window "
                             f"{window}; varlen attention does not implement sliding windows")
    # (B, H, T, D) -> (B*T, H, D): one token axis shared by every segment.
    q_tokens = query.transpose(1, 2).reshape(batch * seq_len, q_heads, head_dim)
    k_tokens = key.transpose(1, 2).reshape(batch * seq_len, kv_heads, head_dim)
    v_tokens = value.transpose(1, 2).reshape(batch * seq_len, kv_heads, head_dim)
    dropout_p = dropout if module.training else 0.0
    flash_dtype = _flash_dtype(query, dropout_p)
    if flash_dtype is not None:
        out_tokens = _flash_varlen(q_tokens, k_tokens, v_tokens, segments, scaling, flash_dtype)
    else:
        out_tokens = _bucketed_sdpa(q_tokens, k_tokens, v_tokens, segments, scaling, dropout_p)
    return out_tokens.view(batch, seq_len, q_heads, head_dim), None


AttentionInterface.register(VARLEN, varlen_attention)
# The flash mask function hands the 2-D padding mask through untouched (None when nothing is padded).
AttentionMaskInterface.register(VARLEN, flash_attention_mask)


# ---- capability table and backend choice ------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _model_class(config_class: type):
    return AutoModelForCausalLM._model_mapping[config_class]


def capability(config: PretrainedConfig, attention: str, device: str) -> tuple[bool, str]:
    """(works, why) for one model family x attention path x device ("cpu" or "cuda")."""
    family = config.model_type
    try:
        model_class = _model_class(type(config))
    except KeyError:
        return False, f"{family} is not a causal language model that transformers knows"
    if attention == "eager":
        return True, "reference implementation; packed rows get a dense (Σs)² block-diagonal mask"
    if attention == "sdpa":
        if not getattr(model_class, "_supports_sdpa", False):
            return False, f"{family} has no sdpa attention in transformers (e.g. Gemma 2's soft-capping)"
        return True, "packed rows get a dense (Σs)² block-diagonal mask: correct, can be slower than padding"
    if attention == VARLEN:
        if not getattr(model_class, "_supports_attention_backend", False):
            return False, f"{family} does not route attention through transformers' AttentionInterface"
        if getattr(config, "attn_logit_softcapping", None):
            return False, f"{family} uses attention logit soft-capping, which varlen does not implement"
        if device == "cuda" and _torch_varlen_attn is not None:
            return True, "Σs² cost: torch varlen_attn (FlashAttention kernel) in bf16/fp16, per-segment SDPA in fp32"
        return True, "Σs² cost: SDPA per bucket of similar-length segments"
    if attention == "flash_attention_2":
        if device != "cuda":
            return False, "flash_attention_2 needs a CUDA GPU"
        if not is_flash_attn_2_available():
            return False, "flash_attention_2 needs the flash-attn package (pip install -r requirements-gpu.txt)"
        if not getattr(model_class, "_supports_flash_attn", False):
            return False, f"{family} has no flash_attention_2 support in transformers"
        return True, "the blog's path: Σs² cost with cu_seq_lens from the collator"
    return False, f"unknown attention {attention!r}"


AUTO_ORDER = ("flash_attention_2", VARLEN, "sdpa", "eager")


def resolve_attention(requested: str, config: PretrainedConfig, device: str) -> str:
    """The attention that will run: `auto` takes the first path that works here; a named one must work."""
    if requested == "auto":
        for candidate in AUTO_ORDER:
            if capability(config, candidate, device)[0]:
                return candidate
        raise DemoInputError(f"no attention path works for {config.model_type} on {device}")
    works, why = capability(config, requested, device)
    if not works:
        raise DemoInputError(f"attention {requested!r} is unavailable for {config.model_type} on {device}: {why}")
    return requested


def capability_table(configs: dict[str, PretrainedConfig], devices=("cpu", "cuda")) -> list[dict]:
    """Rows of (model, attention, device, works, why) for the CLI and the app."""
    return [
        {"model": name, "attention": attention, "device": device, "works": works, "why": why}
        for name, config in configs.items()
        for attention in AUTO_ORDER
        for device in devices
        for works, why in [capability(config, attention, device)]
    ]
