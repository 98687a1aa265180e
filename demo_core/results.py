"""Result and Comparison: what a run returns and its JSON form (the document the CLI writes and the API returns).

JSON document: `config`, `dataset_stats`, `results` (one per collator), `comparison` (per collator: speedup vs
padded, ideal speedup, loss difference vs padded), plus `contamination` and `environment`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path

from .collators import BASELINE, collator_spec


@dataclasses.dataclass
class Result:
    """One collator's burst. Throughput leaves out step 1 (warm-up: allocator, kernel selection, lazy init)."""

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

    def _timed(self, values: list) -> list:
        return values[1:] if len(values) > 1 else values

    @property
    def real_tokens(self) -> int:
        return sum(self.step_real_tokens)

    @property
    def padded_slots(self) -> int:
        return sum(self.step_padded_slots)

    @property
    def pad_fraction(self) -> float:
        return 1.0 - self.real_tokens / self.padded_slots if self.padded_slots else 0.0

    @property
    def tokens_per_s(self) -> float:
        return sum(self._timed(self.step_real_tokens)) / sum(self._timed(self.step_times_s))

    @property
    def tokens_per_s_per_device(self) -> list[float]:
        """Each rank's real tokens over the group's step time; they add up to `tokens_per_s`, the aggregate."""
        ranks = self.rank_step_real_tokens or [self.step_real_tokens]
        return [sum(self._timed(tokens)) / sum(self._timed(self.step_times_s)) for tokens in ranks]

    @property
    def samples_per_s(self) -> float:
        return sum(self._timed(self.step_examples)) / sum(self._timed(self.step_times_s))

    @property
    def step_time_median_s(self) -> float:
        return statistics.median(self._timed(self.step_times_s))

    @property
    def collate_time_share(self) -> float:
        """Collating happens outside the timed step, so its share is collate / (collate + step)."""
        collate = sum(self._timed(self.step_collate_s))
        return collate / (collate + sum(self._timed(self.step_times_s)))

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for name in ("real_tokens", "padded_slots", "pad_fraction", "tokens_per_s", "tokens_per_s_per_device",
                     "samples_per_s", "step_time_median_s", "collate_time_share"):
            data[name] = getattr(self, name)
        return data


def compare(results: list[Result], ideal_speedup: float) -> dict:
    """Per collator: measured speedup and loss difference against `padded`, and the ideal from the data."""
    padded = next((r for r in results if r.collator == BASELINE), None)
    comparison = {}
    for result in results:
        padded_layout = collator_spec(result.collator).layout == "padded"
        entry = {"ideal_speedup": 1.0 if padded_layout else ideal_speedup,
                 "speedup_vs_padded": None, "ratio_to_ideal": None, "max_abs_loss_diff_vs_padded": None,
                 "peak_memory_vs_padded": None}
        if padded is not None:
            entry["speedup_vs_padded"] = result.tokens_per_s / padded.tokens_per_s
            entry["ratio_to_ideal"] = entry["speedup_vs_padded"] / entry["ideal_speedup"]
            shared = min(len(result.losses), len(padded.losses))
            if shared:
                entry["max_abs_loss_diff_vs_padded"] = max(
                    abs(a - b) for a, b in zip(result.losses[:shared], padded.losses[:shared]))
            if result.peak_memory_bytes and padded.peak_memory_bytes:
                entry["peak_memory_vs_padded"] = result.peak_memory_bytes / padded.peak_memory_bytes - 1.0
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

    def to_dict(self) -> dict:
        return {
            "config": self.config,
            "dataset_stats": self.dataset_stats,
            "results": [result.to_dict() for result in self.results],
            "comparison": compare(self.results, self.ideal_speedup),
            "ideal_speedup": self.ideal_speedup,
            "contamination": self.contamination,
            "environment": self.environment,
            "partial": self.partial,
        }


def write_json(document: dict, path: str | os.PathLike) -> None:
    """Writes atomically: a reader never sees half a file."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2))
    os.replace(temporary, path)
