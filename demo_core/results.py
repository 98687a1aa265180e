"""Result and Comparison: what a run returns and its JSON form (the document the CLI writes and the API returns).

JSON document: `config`, `dataset_stats`, `results` (one per collator: per-step series, robust throughput over the
timed steps, the profiled steps' `time_anatomy`), `comparison` (per collator: speedup vs padded with its range,
the slots and work ideals, loss difference vs padded, `flags`), plus `contamination` (or why not:
`contamination_not_checked`), `environment`, `memory_guard` and, for a run that ran out of memory, `stop_reason`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from pathlib import Path

from demo_core.collators import BASELINE, collator_spec
from demo_core.precision import PRECISIONS
from demo_core.step_statistics import MIN_TIMED_STEPS, log_half_spread, robust_summary, timed_step_indices


@dataclasses.dataclass
class Result:
    """One collator's burst. Throughput counts timed steps only: not step 1 (warm-up: allocator, kernel selection,
    lazy init) and not the profiled step (the profiler slows it; see anatomy.py)."""

    collator: str
    attention: str
    device: str
    precision: str
    steps: int
    losses: list[float]
    step_times_s: list[float]
    step_real_tokens: list[int]
    step_padded_slots: list[int]
    step_examples: list[int]
    step_collate_s: list[float]
    peak_memory_bytes: int | None
    memory: dict
    partial: bool = False
    world_size: int = 1
    # Under DDP (see distributed.merge_ranks) the step_* lists are the whole group's; these keep each rank's share.
    rank_step_real_tokens: list[list[int]] = dataclasses.field(default_factory=list)
    rank_peak_memory_bytes: list[int | None] = dataclasses.field(default_factory=list)
    step_work_flops: list[float] = dataclasses.field(default_factory=list)  # work.step_flops of each step's batch
    # Tokens that carry loss per step (labels that are not -100, past each sequence's first): real tokens are what the
    # model computes, trained tokens what its loss averages over (with prompt tokens masked, fewer).
    step_trained_tokens: list[int] = dataclasses.field(default_factory=list)
    profiled_step: int | None = None  # 1-based: the first of `profiled_steps` (documents before them had only it)
    time_anatomy: dict | None = None  # the centre of the profiled steps' anatomies (anatomy.robust_anatomy)
    profiled_steps: list[int] = dataclasses.field(default_factory=list)  # 1-based, left out of the throughput
    step_anatomies: list[dict] = dataclasses.field(default_factory=list)  # one per profiled step, in order
    stop_reason: str | None = None  # why a partial burst ended early when nobody stopped it (out of memory)
    # What `peak_memory_bytes` measures on this device, in words (memory_measure.PEAK_KINDS); `memory` says what
    # was alive at that peak (`measured_at_peak`, adding up to it)
    peak_memory_kind: str | None = None
    # Examples (packed rows) per optimizer step over every process and micro-batch, as the Trainer was given them:
    # per_device_train_batch_size x gradient_accumulation_steps x processes (batch_semantics.py; None: saved before)
    effective_batch_size: int | None = None

    @property
    def timed_step_indices(self) -> list[int]:
        return timed_step_indices(len(self.step_times_s), self.profiled_steps or self.profiled_step)

    def _timed(self, values: list) -> list:
        return [values[i] for i in self.timed_step_indices]

    @property
    def timed_steps(self) -> int:
        return len(self.timed_step_indices)

    @property
    def real_tokens(self) -> int:
        return sum(self.step_real_tokens)

    @property
    def trained_tokens(self) -> int:
        return sum(self.step_trained_tokens)

    @property
    def padded_slots(self) -> int:
        return sum(self.step_padded_slots)

    @property
    def pad_fraction(self) -> float:
        return 1.0 - self.real_tokens / self.padded_slots if self.padded_slots else 0.0

    @property
    def seconds_per_slot(self) -> tuple[float, float, float] | None:
        """(lower quartile, trimmed mean, upper quartile) over the timed steps of step time / token slots computed,
        each step weighted by its slots: time per unit of work, so steps of different sizes compare; without the
        trimming it would be total time / total slots, and the trimming drops a step other work slowed down."""
        if not self.timed_steps:
            return None
        slots = self._timed(self.step_padded_slots)
        return robust_summary([time_s / count for time_s, count in zip(self._timed(self.step_times_s), slots)], slots)

    @property
    def log_spread(self) -> float | None:
        """The trimmed time per slot x exp(±this) spans the middle half of the timed steps' slots."""
        summary = self.seconds_per_slot
        return None if summary is None else log_half_spread(summary[0], summary[2])

    @property
    def real_fraction(self) -> float:
        """Real tokens per computed slot over the timed steps."""
        return sum(self._timed(self.step_real_tokens)) / sum(self._timed(self.step_padded_slots))

    @property
    def tokens_per_s(self) -> float | None:
        """Real tokens per second at the trimmed time per slot (None without timed steps)."""
        quarters = self.seconds_per_slot
        return None if quarters is None else self.real_fraction / quarters[1]

    @property
    def tokens_per_s_range(self) -> list[float] | None:
        """[low, high]: tokens/s at the upper and lower quartile of the time per slot (the middle half of steps)."""
        quarters = self.seconds_per_slot
        return None if quarters is None else [self.real_fraction / quarters[2], self.real_fraction / quarters[0]]

    @property
    def tokens_per_s_per_device(self) -> list[float] | None:
        """Each rank's share of `tokens_per_s` (by its real tokens); they add up to the aggregate."""
        if self.tokens_per_s is None:
            return None
        total = sum(self._timed(self.step_real_tokens))
        ranks = self.rank_step_real_tokens or [self.step_real_tokens]
        return [self.tokens_per_s * sum(self._timed(tokens)) / total for tokens in ranks]

    @property
    def samples_per_s(self) -> float | None:
        if self.tokens_per_s is None:
            return None
        return self.tokens_per_s * sum(self._timed(self.step_examples)) / sum(self._timed(self.step_real_tokens))

    @property
    def step_time_median_s(self) -> float | None:
        return statistics.median(self._timed(self.step_times_s)) if self.timed_steps else None

    @property
    def collate_time_share(self) -> float | None:
        """Collating happens outside the timed step, so its share is collate / (collate + step)."""
        if not self.timed_steps:
            return None
        collate = sum(self._timed(self.step_collate_s))
        return collate / (collate + sum(self._timed(self.step_times_s)))

    @property
    def work_per_real_token(self) -> float | None:
        """FLOPs (work.step_flops) per real token over the timed steps."""
        if not self.timed_steps or not self.step_work_flops:
            return None
        return sum(self._timed(self.step_work_flops)) / sum(self._timed(self.step_real_tokens))

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for name in ("real_tokens", "trained_tokens", "padded_slots", "pad_fraction", "timed_steps", "tokens_per_s",
                     "tokens_per_s_range", "tokens_per_s_per_device", "samples_per_s", "step_time_median_s",
                     "collate_time_share"):
            data[name] = getattr(self, name)
        return data


# Flags a comparison entry can carry (report.FLAG_WORDS says each in words).
ABOVE_IDEAL_TOLERANCE = 0.10  # a measured speedup this far above every ideal is more likely noise than packing
NOISY_SPREAD = 0.25  # speedup_range wider than this share of the speedup: steps disagree


def _speedup_and_range(result: Result, padded: Result) -> tuple[float, list[float]]:
    """Ratio of the robust throughputs, and a range from both collators' step-to-step spreads combined."""
    if result is padded:
        return 1.0, [1.0, 1.0]
    speedup = result.tokens_per_s / padded.tokens_per_s
    spread = math.exp(math.hypot(result.log_spread, padded.log_spread))
    return speedup, [speedup / spread, speedup * spread]


def _flags(result: Result, padded: Result | None, entry: dict) -> list[str]:
    flags = []
    if result.timed_steps < MIN_TIMED_STEPS or (padded is not None and padded.timed_steps < MIN_TIMED_STEPS):
        flags.append("few-timed-steps")
    speedup, ideals = entry["speedup_vs_padded"], [entry["ideal_speedup"], entry["work_ideal_speedup"] or 0.0]
    if speedup is not None and speedup > (1 + ABOVE_IDEAL_TOLERANCE) * max(ideals):
        flags.append("above-ideal")
    low_high = entry["speedup_range"]
    if low_high is not None and (low_high[1] - low_high[0]) > NOISY_SPREAD * speedup:
        flags.append("noisy")
    if not collator_spec(result.collator).same_batches_as_padded:
        flags.append("other-batches")
    if result.device == "cpu" and PRECISIONS[result.precision].slow_on_cpu:
        flags.append("slow-precision")
    return flags


def own_ideal_speedup(result: Result, ideal_speedup: float) -> float:
    """The slots ideal of `result` from its own batches: padded's slots per real token (the run's `ideal_speedup`)
    over this collator's, over its timed steps (all its steps when none is timed). A packed row has none to lose, so
    its ideal is the run's; padded-grouped still pads, less than padded (orcamath-like: 3.3% of its slots instead of
    15.7%), so its ideal is above 1 (1.15x there) and not the run's 1.00x of padding."""
    if result.collator == BASELINE:
        return 1.0
    indices = result.timed_step_indices or range(len(result.step_padded_slots))
    slots = sum(result.step_padded_slots[index] for index in indices)
    real = sum(result.step_real_tokens[index] for index in indices)
    return ideal_speedup * real / slots if slots else ideal_speedup


def compare(results: list[Result], ideal_speedup: float, predicted: dict[str, float] | None = None) -> dict:
    """Per collator against `padded`: measured speedup with its range, the step-time model's predicted one
    (`predicted`, per collator: throughput/run_prediction.py; None where the device has no entry), the slots and
    work ideals (both from the collator's own batches), the loss difference, and `flags` that say when a number
    should not be taken at face value. `ideal_speedup` is the run's: padded's slots per real token over the timed
    steps."""
    padded = next((r for r in results if r.collator == BASELINE), None)
    comparison = {}
    for result in results:
        entry = {"ideal_speedup": own_ideal_speedup(result, ideal_speedup), "work_ideal_speedup": None,
                 "speedup_vs_padded": None, "speedup_range": None, "ratio_to_ideal": None,
                 "predicted_speedup_vs_padded": (predicted or {}).get(result.collator),
                 "ratio_to_work_ideal": None, "max_abs_loss_diff_vs_padded": None, "peak_memory_vs_padded": None}
        if padded is not None:
            if result.work_per_real_token and padded.work_per_real_token:
                entry["work_ideal_speedup"] = padded.work_per_real_token / result.work_per_real_token
            if min(result.timed_steps, padded.timed_steps) >= MIN_TIMED_STEPS:
                entry["speedup_vs_padded"], entry["speedup_range"] = _speedup_and_range(result, padded)
                entry["ratio_to_ideal"] = entry["speedup_vs_padded"] / entry["ideal_speedup"]
                if entry["work_ideal_speedup"]:
                    entry["ratio_to_work_ideal"] = entry["speedup_vs_padded"] / entry["work_ideal_speedup"]
            shared = min(len(result.losses), len(padded.losses))
            if shared:
                entry["max_abs_loss_diff_vs_padded"] = max(
                    abs(a - b) for a, b in zip(result.losses[:shared], padded.losses[:shared]))
            if result.peak_memory_bytes and padded.peak_memory_bytes:
                entry["peak_memory_vs_padded"] = result.peak_memory_bytes / padded.peak_memory_bytes - 1.0
        entry["flags"] = _flags(result, padded, entry)
        comparison[result.collator] = entry
    return comparison


@dataclasses.dataclass
class Comparison:
    config: dict
    dataset_stats: dict
    results: list[Result]
    ideal_speedup: float
    contamination: list[dict]
    environment: dict
    partial: bool = False
    contamination_not_checked: str | None = None  # why `contamination` is empty: nothing was compared
    memory_guard: dict | None = None  # memory_guard.RunMemory: the predicted peak the run was let through with
    predicted_speedups: dict[str, float] | None = None  # the step-time model's, per collator, for this run's device

    @property
    def stop_reason(self) -> str | None:
        """Why the run ended early on its own (a burst ran out of memory), naming the collator; None otherwise."""
        return next((f"{result.collator}: {result.stop_reason}" for result in self.results if result.stop_reason),
                    None)

    def to_dict(self) -> dict:
        predicted = self.predicted_speedups or {}
        return {
            "config": self.config,
            "dataset_stats": self.dataset_stats,
            "results": [{**result.to_dict(), "predicted_speedup_vs_padded": predicted.get(result.collator)}
                        for result in self.results],
            "comparison": compare(self.results, self.ideal_speedup, predicted),
            "ideal_speedup": self.ideal_speedup,
            "contamination": self.contamination,
            "contamination_not_checked": self.contamination_not_checked,
            "environment": self.environment,
            "partial": self.partial,
            "memory_guard": self.memory_guard,
            "stop_reason": self.stop_reason,  # the engine's own; a Stop or a time budget the app adds (serving/gpu.py)
        }


def write_json(document: dict, path: str | os.PathLike) -> None:
    """Writes atomically: a reader never sees half a file."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2))
    os.replace(temporary, path)
