"""Where the examples of a batch lie: segments from the collator's `cu_seq_lens`, `position_ids` restarts, the 2-D
padding mask and the model's own mask breaks, and their buckets of similar lengths (one SDPA call each on the CPU
path). varlen attention reads them; so does the memory guard (`bucket_shapes`)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import torch

from demo_core.caches import on_release
from demo_core.errors import DemoInputError

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


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def _segment_start_flags(batch: int, seq_len: int, attention_mask, position_ids, cu_seq_lens, mask_breaks) -> tuple:
    """(real, starts): (batch, seq) bool arrays, which slots hold real tokens and which begin a segment."""
    starts = np.zeros((batch, seq_len), dtype=bool) if mask_breaks is None else mask_breaks.copy()
    starts[:, 0] = True
    if cu_seq_lens is not None and batch == 1:
        bounds = as_numpy(cu_seq_lens).astype(np.int64)
        if bounds[-1] != seq_len:
            raise DemoInputError(f"cu_seq_lens ends at {bounds[-1]} but the packed row has {seq_len} tokens")
        starts[0, bounds[:-1][bounds[:-1] < seq_len]] = True  # an empty last segment starts nowhere
    elif position_ids is not None:
        # transformers' own packing rule: a new sequence starts wherever the position does not continue by one.
        positions = np.broadcast_to(as_numpy(position_ids), (batch, seq_len))
        starts[:, 1:] |= positions[:, 1:] != positions[:, :-1] + 1
    if attention_mask is None:
        return np.ones((batch, seq_len), dtype=bool), starts
    real = as_numpy(attention_mask).astype(bool)
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


class SegmentCache(threading.local):
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

    def clear(self) -> None:
        """Drops this thread's forward (another thread's entry goes when that thread ends)."""
        self.key = self.segments = None


segment_cache = SegmentCache()
on_release(segment_cache.clear)
