"""Attention paths for packed rows: our varlen attention, backend choice and the capability table.

transformers' built-in packed path on sdpa/eager builds a dense (T, T) block-diagonal mask over the whole packed
row, so it pays (Σ sᵢ)² for attention and can end up slower than padding. `varlen_attention` pays Σ sᵢ²: it finds
the segments (from the collator's `cu_seq_lens_q`, else from `position_ids` restarts, else from a right- or
left-padded 2-D mask) and attends within each one:
- CUDA, half precision, PyTorch with `torch.nn.attention.varlen.varlen_attn`: one FlashAttention varlen call over
  the real tokens (no flash-attn build needed).
- elsewhere: SDPA with `is_causal=True` over buckets of similar-length segments, each right-padded to the bucket's
  longest. Causality makes that padding harmless: a real query at position i only sees keys 0..i, which are real.
  Buckets keep the Python overhead to a few SDPA calls per layer instead of one per example.
It is registered with transformers' `AttentionInterface` under the name "varlen".
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, PretrainedConfig
from transformers.utils import is_flash_attn_2_available

from .errors import DemoInputError

VARLEN = "varlen"
# A bucket takes a segment when padding it to the bucket's longest costs little: within 25% or 16 tokens.
_BUCKET_SLACK_RATIO = 1.25
_BUCKET_SLACK_TOKENS = 16


@dataclasses.dataclass
class Segments:
    """Where each attended segment lies in the flattened (batch * seq) token axis."""

    starts: list[int]
    lengths: list[int]
    # Per bucket: gather index (n, L) into the token axis, and which of those entries are real tokens.
    buckets: list[tuple[torch.Tensor, torch.Tensor]]
    real_index: torch.Tensor  # all real token positions, segment by segment
    cu_seqlens: torch.Tensor  # int32 (n_segments + 1,) over `real_index`

    @property
    def max_length(self) -> int:
        return max(self.lengths)


def _contiguous_run(row: torch.Tensor, row_index: int) -> tuple[int, int]:
    """(first, count) of a mask row's ones; refuses holes, which no segment list can express."""
    ones = torch.nonzero(row, as_tuple=False).flatten()
    if ones.numel() == 0:
        return 0, 0
    first, count = int(ones[0]), int(ones.numel())
    if int(ones[-1]) - first + 1 != count:
        raise DemoInputError(
            f"varlen attention got an attention mask with holes in row {row_index}: it only honours padding at "
            f"the start or end of a row; use --attention sdpa for arbitrary masks"
        )
    return first, count


def find_segments(batch: int, seq_len: int, device: torch.device, attention_mask=None, position_ids=None,
                  cu_seq_lens=None) -> Segments:
    starts: list[int] = []
    lengths: list[int] = []
    if cu_seq_lens is not None and batch == 1:
        bounds = cu_seq_lens.tolist()
        starts, lengths = bounds[:-1], [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    else:
        restarts = None
        if position_ids is not None:
            restarts = (position_ids.expand(batch, seq_len) == 0).cpu()
        for row in range(batch):
            first, count = (0, seq_len) if attention_mask is None else _contiguous_run(attention_mask[row], row)
            cuts = [first]
            if restarts is not None:
                cuts += [int(t) for t in torch.nonzero(restarts[row, first + 1:first + count]).flatten() + first + 1]
            cuts.append(first + count)
            for start, end in zip(cuts[:-1], cuts[1:]):
                if end > start:
                    starts.append(row * seq_len + start)
                    lengths.append(end - start)
    if not lengths:
        raise DemoInputError("varlen attention got a batch without any real token")
    buckets = []
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    while order:
        longest = lengths[order[0]]
        members = [i for i in order if lengths[i] * _BUCKET_SLACK_RATIO >= longest
                   or longest - lengths[i] <= _BUCKET_SLACK_TOKENS]
        order = [i for i in order if i not in set(members)]
        bucket_starts = torch.tensor([starts[i] for i in members])
        bucket_lengths = torch.tensor([lengths[i] for i in members])
        offsets = torch.arange(longest)
        real = offsets[None, :] < bucket_lengths[:, None]
        # Padding entries repeat the segment's last token: any valid index works, causality hides them.
        index = bucket_starts[:, None] + torch.minimum(offsets[None, :], bucket_lengths[:, None] - 1)
        buckets.append((index.to(device), real.to(device)))
    real_index = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)]).to(device)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return Segments(starts, lengths, buckets, real_index, cu.to(device))


class _SegmentCache:
    """Every layer of one forward gets the same kwargs tensors: find the segments once per forward, not per layer."""

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


def _has_torch_varlen() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function: q (B, Hq, T, D), k/v (B, Hkv, T, D) -> ((B, T, Hq, D), None)."""
    if kwargs.get("softcap") is not None:
        raise DemoInputError("varlen attention does not implement logit soft-capping (Gemma 2); use eager")
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
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and dropout_p == 0.0 and _has_torch_varlen():
        from torch.nn.attention.varlen import varlen_attn

        index = segments.real_index
        out_real = varlen_attn(
            q_tokens[index], k_tokens[index], v_tokens[index], segments.cu_seqlens, segments.cu_seqlens,
            segments.max_length, segments.max_length, scale=scaling, window_size=(-1, 0),
            enable_gqa=q_heads != kv_heads,
        )
        out_tokens = q_tokens.new_zeros(q_tokens.shape).index_copy(0, index, out_real)
    else:
        outputs, destinations = [], []
        for index, real in segments.buckets:
            # (n, L, H, D) -> (n, H, L, D) for SDPA
            q_bucket = q_tokens[index].transpose(1, 2)
            k_bucket = k_tokens[index].transpose(1, 2)
            v_bucket = v_tokens[index].transpose(1, 2)
            out = F.scaled_dot_product_attention(q_bucket, k_bucket, v_bucket, is_causal=True, scale=scaling,
                                                 dropout_p=dropout_p, enable_gqa=q_heads != kv_heads)
            outputs.append(out.transpose(1, 2)[real])
            destinations.append(index[real])
        out_tokens = q_tokens.new_zeros(q_tokens.shape).index_copy(0, torch.cat(destinations), torch.cat(outputs))
    return out_tokens.view(batch, seq_len, q_heads, head_dim), None


AttentionInterface.register(VARLEN, varlen_attention)


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
        if device == "cuda" and _has_torch_varlen():
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
