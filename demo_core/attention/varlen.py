"""Attention paths for packed rows: our varlen attention, backend choice and the capability table.

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
import functools
import threading
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, PretrainedConfig
from transformers.masking_utils import AttentionMaskInterface
from transformers.utils import is_flash_attn_2_available

from demo_core.attention import kernels as torch_varlen
from demo_core.errors import DemoInputError

VARLEN = "varlen"
# A bucket takes every segment within 25% or 16 tokens of its longest: padding a bucket then costs at most
# 1.25² ≈ 1.6x its attention FLOPs, while FLAN-like lengths (24..1024 tokens) need ~15 SDPA calls per layer.
# Measured on 2 CPU cores (tiny-llama, flan-like): attention is ~15% of a step, gathers ~7%; see docs/RESULTS.md.
_BUCKET_SLACK_RATIO = 1.25
_BUCKET_SLACK_TOKENS = 16
# Arguments that reach attention functions and change nothing here: the segment sources read below, and what
# models and Trainer pass along for other layers or backends (MoE's `output_router_logits`, the loss's
# `num_items_in_batch`). Any other argument that is set (not None, not False) is refused rather than ignored.
_HARMLESS_KWARGS = frozenset({
    "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx",
    "output_attentions", "output_router_logits", "num_items_in_batch", "use_cache", "cache_position",
    "past_key_values", "layer_idx", "is_causal", "target_dtype", "position_embeddings",
})


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


def _segment_start_flags(batch: int, seq_len: int, attention_mask, position_ids, cu_seq_lens, mask_breaks) -> tuple:
    """(real, starts): (batch, seq) bool arrays, which slots hold real tokens and which begin a segment."""
    starts = np.zeros((batch, seq_len), dtype=bool) if mask_breaks is None else mask_breaks.copy()
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
                  cu_seq_lens=None, mask_breaks: np.ndarray | None = None) -> Segments:
    """Segments from `cu_seq_lens` (one packed row) or `position_ids` restarts, the 2-D padding mask, and
    `mask_breaks` ((batch, seq) bool: where the model's own mask starts anew, see `_mask_breaks`).

    Index bookkeeping runs in NumPy: these are small integer arrays, and torch would hand each op to its OpenMP
    pool, whose synchronisation costs milliseconds per op on a busy 2-core machine (measured: 10x slower).
    """
    real, starts = _segment_start_flags(batch, seq_len, attention_mask, position_ids, cu_seq_lens, mask_breaks)
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
    """Segments for layers that get no mask function (the model passed a 2-D mask or none): every layer of one
    forward gets the same kwargs tensors, so find them once per forward, not per layer.

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
    breaks[:, 1:] = ~_as_numpy(sees_previous)
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
    segments = _cache.get(batch, seq_len, device, attention_mask, position_ids, cu_seq_lens)
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


# ---- capability table and backend choice ------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def model_class(config_class: type):
    return AutoModelForCausalLM._model_mapping[config_class]


def routes_through_attention_interface(causal_lm_class: type) -> bool:
    """Whether the model's attention layers look their function up in transformers' AttentionInterface, the only
    way a registered attention such as varlen ever runs. transformers' own test for it (it reads the modeling
    source for `ALL_ATTENTION_FUNCTIONS.get_interface(`); the class flag `_supports_attention_backend` is missing on
    families that do route through it (stablelm)."""
    return causal_lm_class._can_set_attn_implementation()


def _varlen_on_device(device: str) -> str:
    if device != "cuda":
        return "Σs² cost: SDPA per bucket of similar-length segments"
    if torch_varlen.INSTALLED is None:
        return f"Σs² cost: SDPA per bucket of similar-length segments ({torch_varlen.absence_reason()})"
    return (f"Σs² cost: {torch_varlen.INSTALLED.describe()} in bf16/fp16; per-bucket SDPA in fp32 and for "
            f"attention sinks")


def capability(config: PretrainedConfig, attention: str, device: str) -> tuple[bool, str]:
    """(works, why) for one model family x attention path x device ("cpu" or "cuda").

    This reads the config and the code, cheaply; whether packing is then exact for this model is the pre-flight
    check's question (preflight.py), answered with a forward pass.
    """
    family = config.model_type
    try:
        causal_lm_class = model_class(type(config))
    except KeyError:
        return False, f"{family} is not a causal language model that transformers knows"
    if attention == "eager":
        return True, "reference implementation; packed rows get a dense (Σs)² block-diagonal mask"
    if attention == "sdpa":
        if not getattr(causal_lm_class, "_supports_sdpa", False):
            return False, f"{family} has no sdpa attention in transformers (e.g. Gemma 2's soft-capping)"
        return True, "packed rows get a dense (Σs)² block-diagonal mask: correct, can be slower than padding"
    if attention == VARLEN:
        if not routes_through_attention_interface(causal_lm_class):
            return False, (f"{family} computes attention in its own code, not through transformers' "
                           f"AttentionInterface, so varlen would never run")
        if getattr(config.get_text_config(), "attn_logit_softcapping", None):
            return False, f"{family} uses attention logit soft-capping, which varlen does not implement"
        return True, _varlen_on_device(device)
    if attention == "flash_attention_2":
        if device != "cuda":
            return False, "flash_attention_2 needs a CUDA GPU"
        if not is_flash_attn_2_available():
            return False, "flash_attention_2 needs the flash-attn package (pip install -r requirements-gpu.txt)"
        if not getattr(causal_lm_class, "_supports_flash_attn", False):
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
