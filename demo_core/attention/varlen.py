"""Our varlen attention for packed rows (segments.py finds the segments; capability.py says where it works).

transformers' built-in packed path on sdpa/eager builds a dense (T, T) block-diagonal mask over the whole packed
row, so it pays (Σ sᵢ)² for attention and can end up slower than padding. `varlen_attention` pays Σ sᵢ²: it finds
the segments (from the collator's `cu_seq_lens_q`, else from `position_ids` restarts, plus a right- or left-padded
2-D mask) and attends within each one:
- CUDA in half precision (bf16/fp16 tensors, or fp32 tensors under a bf16/fp16 autocast) with PyTorch's
  `torch.nn.attention.varlen.varlen_attn` (see torch_varlen.py for its versions): one FlashAttention varlen call
  over the real tokens, no flash-attn build.
- elsewhere: SDPA over buckets of similar-length segments, each right-padded to the bucket's longest. Causality
  makes that padding harmless: a real query at position i only sees keys 0..i, which are real. Buckets keep the
  Python overhead to a few SDPA calls per layer instead of one per example.

It computes what transformers' eager attention computes for each example alone, or refuses with a `DemoInputError`:
- the attention pattern comes from the model's own mask function (`VarlenMask`): transformers hands every
  attention implementation's mask builder the function that describes the pattern (causal, sliding window, chunked,
  with or without packing), so reading it catches windows and chunks that never reach the attention call as
  arguments (qwen2_moe's `use_sliding_window`, Llama 4's chunked layers). Where a token cannot see the one before it
  (a new packed example, a new chunk), a new segment starts; inside segments the pattern must be causal or a sliding
  window (a banded mask, or the kernel's `window_size`); anything else (bidirectional blocks) is refused;
- attention sinks (`s_aux`, gpt_oss): a zero key/value per segment whose logit is the sink, as in eager's softmax
  over [scores, sink];
- a value head dim different from the query's (MLA, deepseek_v3);
- logit soft-capping, bidirectional layers, a KV cache and arguments it does not know are refused.
It is registered with transformers' `AttentionInterface` under the name "varlen", and `varlen_mask` with its
`AttentionMaskInterface` (transformers skips mask creation for names without one, which would silently attend to
left padding and drop mask-only windows).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from demo_core.attention import kernels as torch_varlen
from demo_core.errors import DemoInputError
from demo_core.segments import Segments, as_numpy, find_segments, segment_cache

VARLEN = "varlen"
# Arguments that reach attention functions and change nothing here: the segment sources read below, and what
# models and Trainer pass along for other layers or backends (MoE's `output_router_logits`, the loss's
# `num_items_in_batch`). Any other argument that is set (not None, not False) is refused rather than ignored.
_HARMLESS_KWARGS = frozenset({
    "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx",
    "output_attentions", "output_router_logits", "num_items_in_batch", "use_cache", "cache_position",
    "past_key_values", "layer_idx", "is_causal", "target_dtype", "position_embeddings",
})


# ---- the attention pattern inside one example ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Pattern:
    """Which keys a query sees inside its segment, by offsets from the segment's start: every earlier key and itself
    (causal), or the last `size` of them, itself included (sliding; transformers' `sliding_window` convention,
    `kv > q - size`)."""

    kind: str  # "causal" | "sliding"
    size: int | None = None

    def allowed(self, length: int, device: torch.device) -> torch.Tensor:
        """(length, length) bool: query offset (rows) may attend to key offset (columns)."""
        offsets = torch.arange(length, device=device)
        query, key = offsets[:, None], offsets[None, :]
        allowed = key <= query
        if self.kind == "sliding":
            allowed &= key > query - self.size
        return allowed


CAUSAL = Pattern("causal")


@dataclasses.dataclass(eq=False)
class VarlenMask:
    """What `varlen_mask` hands the attention layers: the padding and the model's own mask function.

    A new object per forward and mask type (full, sliding, chunked), shared by the layers of that type: the first
    layer that gets it reads the mask function into `segments` and `pattern`, the others reuse them.
    """

    padding_mask: torch.Tensor | None  # (batch, seq) bool, None when nothing is padded
    mask_function: Callable
    segments: Segments | None = None
    pattern: Pattern | None = None


def _evaluate(mask_function: Callable, batch_index, query_index, key_index) -> torch.Tensor:
    """The model's mask at broadcastable index tensors (transformers' own non-vmap sdpa mask calls it this way)."""
    try:
        return torch.as_tensor(mask_function(batch_index, 0, query_index, key_index), device=query_index.device)
    except Exception as error:  # a model's custom mask function that only takes scalars
        raise DemoInputError(f"varlen attention cannot read this model's attention mask function "
                             f"({type(error).__name__}); use --attention sdpa or eager") from None


def _mask_breaks(mask_function: Callable, batch: int, seq_len: int, device: torch.device) -> np.ndarray:
    """(batch, seq) bool: tokens that cannot see the token just before them in their row. That is where the model's
    mask starts anew: a packed example it found from position_ids, or a chunk of chunked attention (each chunk then
    attends causally, so chunks become segments of their own). Costs one mask value per token."""
    rows = torch.arange(batch, device=device)[:, None]
    later = torch.arange(1, seq_len, device=device)[None, :]
    sees_previous = _evaluate(mask_function, rows, later, later - 1).expand(batch, seq_len - 1)
    breaks = np.zeros((batch, seq_len), dtype=bool)
    breaks[:, 1:] = ~as_numpy(sees_previous)
    return breaks


def infer_pattern(mask_function: Callable, segments: Segments, seq_len: int) -> Pattern:
    """The pattern the model's mask draws inside every segment: causal, or a sliding window whose width is read off
    the widest row; checked on every pair of tokens in the same segment (Σ L² booleans per forward and mask type,
    where the attention costs that times heads times head dim). Anything else is refused."""
    blocks = []  # (allowed & valid, valid) per bucket, (n, L, L), by offsets from each segment's start
    for bucket in segments.buckets:
        n, length = bucket.gather_index.shape
        rows, columns = bucket.gather_index // seq_len, bucket.gather_index % seq_len
        allowed = _evaluate(mask_function, rows[:, :1, None], columns[:, :, None], columns[:, None, :])
        real = torch.zeros(n * length, dtype=torch.bool, device=rows.device)
        real[bucket.keep_index] = True
        valid = real.view(n, length)[:, :, None] & real.view(n, length)[:, None, :]
        blocks.append((allowed.expand(n, length, length) & valid, valid))
    widest_row = max(int(allowed.sum(-1).max()) for allowed, _ in blocks)
    for pattern in (CAUSAL, Pattern("sliding", widest_row)):
        if all(torch.equal(allowed, pattern.allowed(allowed.shape[-1], allowed.device) & valid)
               for allowed, valid in blocks):
            return pattern
    raise DemoInputError(
        "this model's attention mask inside an example is neither causal nor a sliding window (e.g. bidirectional "
        "blocks): varlen attention cannot compute it; use --attention sdpa or eager"
    )


def varlen_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                mask_function: Callable | None = None, attention_mask: torch.Tensor | None = None,
                **kwargs) -> VarlenMask:
    """transformers mask-interface function for "varlen": keeps the model's mask function for the attention layers
    instead of drawing a (T, T) mask."""
    if q_length != kv_length:
        raise DemoInputError("varlen attention is for training: it does not run with a KV cache")
    padding_mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask
    return VarlenMask(padding_mask, mask_function)


# ---- the attention function ---------------------------------------------------------------------------------------

class _CallCounter(threading.local):
    """How many times varlen attention ran in this thread: lets the pre-flight check prove that a model really
    routes its attention through it."""

    count = 0


calls = _CallCounter()


def _flash_dtype(query: torch.Tensor, dropout_p: float) -> torch.dtype | None:
    """The half dtype PyTorch's varlen kernel should run in here, or None when it cannot run."""
    if torch_varlen.INSTALLED is None or not query.is_cuda or dropout_p > 0.0:
        return None
    if query.dtype in (torch.float16, torch.bfloat16):
        return query.dtype
    # Trainer's bf16/fp16 keeps fp32 weights under autocast, and RoPE promotes q/k back to fp32: cast as
    # transformers' own flash path does, or the kernel would never run in a mixed-precision burst.
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    return None


def _kernel_attention(kernel: torch_varlen.VarlenKernel, q_tokens, k_tokens, v_tokens, segments: Segments,
                      scale: float, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """PyTorch's FlashAttention varlen kernel over the real tokens; (B*T, Hq, Dv) out, zeros on padding."""
    if segments.all_real:
        q_real, k_real, v_real = q_tokens, k_tokens, v_tokens
    else:
        index = segments.real_index
        q_real, k_real, v_real = q_tokens[index], k_tokens[index], v_tokens[index]
    out_real = kernel(q_real.to(dtype), k_real.to(dtype), v_real.to(dtype), segments.cu_seqlens,
                      segments.max_length, scale=scale, window=window)
    if segments.all_real:
        return out_real
    shape = (q_tokens.shape[0], q_tokens.shape[1], v_tokens.shape[-1])
    return out_real.new_zeros(shape).index_copy(0, segments.real_index, out_real)


def _bucket_mask(length: int, window: int | None, sinks: torch.Tensor | None, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor | None:
    """SDPA's attn_mask for one bucket of padded length `length`: None for plain causal (is_causal is faster), a
    (L, L) bool band for a window shorter than the bucket, or with sinks a (H, L, L + 1) float mask whose last
    column is each head's sink logit against the zero key appended to every segment."""
    band = window is not None and length > window
    if sinks is None:
        return Pattern("sliding", window).allowed(length, device) if band else None
    allowed = (Pattern("sliding", window) if band else CAUSAL).allowed(length, device)
    scores = torch.zeros(length, length, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))
    heads = sinks.shape[0]
    return torch.cat([scores.expand(heads, length, length),
                      sinks.to(dtype)[:, None, None].expand(heads, length, 1)], dim=-1)


def _bucketed_sdpa(q_tokens, k_tokens, v_tokens, segments: Segments, scale: float, dropout_p: float,
                   window: int | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """SDPA per bucket of similar-length segments; (B*T, Hq, Dv) out, zeros on padding."""
    gqa = q_tokens.shape[1] != k_tokens.shape[1]
    outputs = []
    for bucket in segments.buckets:
        index = bucket.gather_index
        # (n, L, H, D) -> (n, H, L, D) for SDPA
        query, key, value = (t[index].transpose(1, 2) for t in (q_tokens, k_tokens, v_tokens))
        length = index.shape[1]
        mask = _bucket_mask(length, window, sinks, query.dtype, query.device)
        if sinks is not None:  # a zero key and value after each segment: the sink takes softmax mass, adds nothing
            key, value = F.pad(key, (0, 0, 0, 1)), F.pad(value, (0, 0, 0, 1))
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=mask is None, scale=scale,
                                             dropout_p=dropout_p, enable_gqa=gqa)
        n, heads, _, head_dim = out.shape
        outputs.append(out.transpose(1, 2).reshape(n * length, heads, head_dim).index_select(0, bucket.keep_index))
    kept = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    if segments.all_real:  # every slot is written exactly once: no need to zero the output first
        return torch.empty_like(kept).index_copy(0, segments.bucket_destination, kept)
    shape = (q_tokens.shape[0], *kept.shape[1:])
    return kept.new_zeros(shape).index_copy(0, segments.bucket_destination, kept)


def _segments_and_pattern(attention_mask, batch: int, seq_len: int, device: torch.device, position_ids,
                          cu_seq_lens, sliding_window: int | None) -> tuple[Segments, Pattern]:
    if isinstance(attention_mask, VarlenMask):
        mask = attention_mask
        if mask.segments is None:
            breaks = _mask_breaks(mask.mask_function, batch, seq_len, device)
            mask.segments = find_segments(batch, seq_len, device, mask.padding_mask, position_ids, cu_seq_lens,
                                          breaks)
            mask.pattern = infer_pattern(mask.mask_function, mask.segments, seq_len)
        return mask.segments, mask.pattern
    if attention_mask is not None and attention_mask.dim() != 2:
        raise DemoInputError("varlen attention takes a 2-D padding mask or none; this model built its own "
                             f"{attention_mask.dim()}-D mask, which varlen cannot read; use --attention sdpa or eager")
    # No mask function reached us (the model passed its 2-D mask or none): the module's own window is all we know.
    segments = segment_cache.get(batch, seq_len, device, attention_mask, position_ids, cu_seq_lens)
    return segments, Pattern("sliding", sliding_window) if sliding_window is not None else CAUSAL


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     sliding_window: int | None = None, s_aux: torch.Tensor | None = None, **kwargs):
    """transformers attention function: q (B, Hq, T, Dqk), k (B, Hkv, T, Dqk), v (B, Hkv, T, Dv) ->
    ((B, T, Hq, Dv), None)."""
    calls.count += 1
    if kwargs.get("softcap") is not None:
        raise DemoInputError("varlen attention does not implement logit soft-capping (Gemma 2); use eager")
    if not getattr(module, "is_causal", True) or kwargs.get("is_causal") is False:
        raise DemoInputError("varlen attention is causal only; this layer attends bidirectionally")
    unknown = sorted(name for name, value in kwargs.items()
                     if value is not None and value is not False and name not in _HARMLESS_KWARGS | {"softcap"})
    if unknown:
        raise DemoInputError(f"varlen attention does not implement {', '.join(unknown)}, which this model passes "
                             f"to its attention; use --attention sdpa or eager")
    batch, q_heads, seq_len, head_dim = query.shape
    kv_heads, value_head_dim = key.shape[1], value.shape[-1]
    if key.shape[2] != seq_len:
        raise DemoInputError("varlen attention is for training: it does not run with a KV cache")
    segments, pattern = _segments_and_pattern(attention_mask, batch, seq_len, query.device,
                                              kwargs.get("position_ids"), kwargs.get("cu_seq_lens_q"),
                                              sliding_window)
    window = pattern.size if pattern.kind == "sliding" and pattern.size < segments.max_length else None
    scale = scaling if scaling is not None else head_dim ** -0.5
    # (B, H, T, D) -> (B*T, H, D): one token axis shared by every segment.
    q_tokens = query.transpose(1, 2).reshape(batch * seq_len, q_heads, head_dim)
    k_tokens = key.transpose(1, 2).reshape(batch * seq_len, kv_heads, head_dim)
    v_tokens = value.transpose(1, 2).reshape(batch * seq_len, kv_heads, value_head_dim)
    dropout_p = dropout if module.training else 0.0
    kernel, flash_dtype = torch_varlen.INSTALLED, _flash_dtype(query, dropout_p)
    # The kernel takes no sinks, and windows only from torch 2.11: those run on the exact SDPA path instead.
    if (flash_dtype is not None and s_aux is None and (window is None or kernel.takes_window)
            and kernel.padded_head_dim(head_dim, value_head_dim) <= torch_varlen.MAX_HEAD_DIM):
        out_tokens = _kernel_attention(kernel, q_tokens, k_tokens, v_tokens, segments, scale, window, flash_dtype)
    else:
        out_tokens = _bucketed_sdpa(q_tokens, k_tokens, v_tokens, segments, scale, dropout_p, window, s_aux)
    return out_tokens.view(batch, seq_len, q_heads, value_head_dim), None


AttentionInterface.register(VARLEN, varlen_attention)
AttentionMaskInterface.register(VARLEN, varlen_mask)




