"""The batches each collator forms from a dataset's length profile, per GPU and per optimizer step.

The step-time model prices real batches, not an average length: padding costs what the longest example of each
micro-batch makes the others pay. Here the example lengths (truncated to max length) are dealt out as the engine's
collators deal them (collators.py):
- padded layout, sequential sampler (`padded`): B examples per GPU per micro-batch, padded to their longest;
- padded layout, group_by_length (`padded-grouped`): transformers' LengthGroupedSampler, mega-batches of 50 batches
  sorted by length, so neighbours have similar lengths;
- packed / naive layout (`flatten`, `trl-padding-free`, `naive-concat`): the same B examples in one row;
- packed rows (`bfd`, `trl-bfd`): every example first packed best-fit-decreasing into rows of at most max_length (what
  `trl.pack_dataset(strategy="bfd")` does), then B rows per GPU per micro-batch, flattened.
The profile is shuffled once with a fixed seed (Trainer's random sampler draws examples in random order).
"""

from __future__ import annotations

import bisect
import dataclasses
import random

from demo_core.collators import CollatorSpec

# transformers' LengthGroupedSampler: mega-batches of this many batches are sorted by length.
GROUP_BY_LENGTH_MEGABATCH = 50
# At most this many optimizer steps are priced per collator: enough for a stable mean on any profile, and fast.
MAX_STEPS_PRICED = 256


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """One forward/backward on one GPU: the example lengths it holds (for packed rows, every example of every row:
    the attention segments), laid out as `layout` (a CollatorSpec layout)."""

    lengths: tuple[int, ...]
    layout: str

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def token_slots(self) -> int:
        """Token positions the model computes: padding included for the padded layout."""
        return len(self.lengths) * max(self.lengths) if self.layout == "padded" else sum(self.lengths)


# One optimizer step: for each GPU, its micro-batches in order.
Step = list[list[MicroBatch]]


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows of at most `capacity` tokens: each length, longest first, into the fullest row it still fits."""
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free tokens, row index), sorted
    for length in sorted(lengths, reverse=True):
        at = bisect.bisect_left(free, (length, -1))
        if at == len(free):
            rows.append([length])
            bisect.insort(free, (capacity - length, len(rows) - 1))
            continue
        room, row = free.pop(at)
        rows[row].append(length)
        bisect.insort(free, (room - length, row))
    return rows


def _grouped_by_length(lengths: list[int], batch: int) -> list[int]:
    megabatch = GROUP_BY_LENGTH_MEGABATCH * batch
    ordered = []
    for start in range(0, len(lengths), megabatch):
        ordered += sorted(lengths[start:start + megabatch], reverse=True)
    return ordered


def collator_steps(lengths: list[int], spec: CollatorSpec, batch_size: int, grad_accum: int, gpus: int,
                   max_length: int, seed: int | None = 0, max_steps: int = MAX_STEPS_PRICED) -> list[Step]:
    """The optimizer steps `spec` trains on this profile: `batch_size` examples (packed rows: rows) per GPU per
    micro-batch, `grad_accum` micro-batches per step, `gpus` GPUs each taking their own micro-batches. `seed`: the
    random order the Trainer's sampler draws; None keeps the profile's order (the engine's sequential sampler)."""
    cut = [min(int(length), max_length) for length in lengths if length > 0]
    if seed is not None:
        random.Random(seed).shuffle(cut)
    if spec.packed_rows:
        units = best_fit_decreasing(cut, max_length)
        if seed is not None:
            random.Random(seed + 1).shuffle(units)
    else:
        ordered = _grouped_by_length(cut, batch_size * grad_accum * gpus) if spec.sampler == "group_by_length" else cut
        units = [[length] for length in ordered]
    per_step = batch_size * grad_accum * gpus
    if len(units) < per_step:  # a profile smaller than one step: repeat it, as epochs would
        units = units * -(-per_step // len(units))
    steps = []
    for start in range(0, len(units) - per_step + 1, per_step):
        chunk = units[start:start + per_step]
        micro = [chunk[index:index + batch_size] for index in range(0, per_step, batch_size)]
        # consecutive micro-batches go to consecutive GPUs (one per rank), grad_accum rounds of them
        steps.append([[MicroBatch(tuple(length for unit in micro[round_ * gpus + rank] for length in unit), spec.layout)
                       for round_ in range(grad_accum)] for rank in range(gpus)])
        if len(steps) == max_steps:
            break
    return steps
