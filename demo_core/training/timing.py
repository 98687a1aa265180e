"""Timing you can trust on a shared machine: robust step statistics, and turns that make bursts alternate.

On a shared CPU the same step can take 2-3x longer from one minute to the next, and a single descheduled step can be
10x slower. Two defences:
- **Robust statistics.** A burst's throughput comes from the time per token slot of its timed steps, each step
  weighted by its slots, and trimmed (`robust_summary`: the mean of the middle half), not a sum that one slow step
  dominates; its spread is the interquartile range.
- **Alternation.** `Turns` passes a single turn between the bursts' threads at step boundaries, so collators' steps
  run ABAB... and every collator samples the same machine load, while each remains a real Trainer run. Only the
  thread holding the turn computes; the others wait in `TurnTaking.on_step_end`, where each burst also steps aside
  from the process's torch state (isolation.py).
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Iterable

import torch
from transformers import TrainerCallback

from demo_core.training.isolation import RunStream

# Fewer timed steps than this and a trimmed mean, a spread and a speedup mean little: the comparison reports none.
MIN_TIMED_STEPS = 3


def timed_step_indices(steps: int, profiled_steps: Iterable[int] | int | None) -> list[int]:
    """0-based indices of the steps throughput counts: not step 1 (warm-up: allocator, kernel selection, lazy init)
    and not the profiled steps (1-based; the profiler slows them; anatomy.py). A single int is the one profiled step
    of documents saved before several were profiled."""
    profiled = {profiled_steps} if isinstance(profiled_steps, int) else set(profiled_steps or ())
    return [index for index in range(1, steps) if index + 1 not in profiled]


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The smallest value with at least `q` of the total weight at or below it."""
    target, cumulative = q * sum(weights), 0.0
    for value, weight in sorted(zip(values, weights)):
        cumulative += weight
        if cumulative >= target:
            return value
    return max(values)


def interquartile_mean(values: list[float], weights: list[float]) -> float:
    """The weighted mean of the middle half of the weight: a trimmed mean that drops the top and bottom quarter,
    where one descheduled step would land, and that with equal values per unit of weight equals the plain mean."""
    total = sum(weights)
    low, high = total / 4, 3 * total / 4
    kept_sum = kept_weight = cumulative = 0.0
    for value, weight in sorted(zip(values, weights)):
        overlap = max(0.0, min(cumulative + weight, high) - max(cumulative, low))
        kept_sum, kept_weight, cumulative = kept_sum + value * overlap, kept_weight + overlap, cumulative + weight
    return kept_sum / kept_weight


def robust_summary(values: list[float], weights: list[float]) -> tuple[float, float, float]:
    """(lower quartile, interquartile mean, upper quartile) of `values`, each counted with its weight."""
    return (weighted_quantile(values, weights, 0.25), interquartile_mean(values, weights),
            weighted_quantile(values, weights, 0.75))


def log_half_spread(low: float, high: float) -> float:
    """Half the width of [low, high] in logs: the centre x exp(±this) spans it. In logs, so that the spreads of two
    collators combine into the spread of their ratio (in quadrature), and a range never reaches zero."""
    return (math.log(high) - math.log(low)) / 2


@contextlib.contextmanager
def torch_threads(count: int | None):
    """torch's intra-op threads set to `count` inside the block (None: unchanged), restored after it."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Turns:
    """One turn, passed round-robin between named participants (threads), in the order given.

    A participant starts with `wait_for_turn`, calls `pass_turn` at each step end (it hands the turn to the next
    participant still in the rotation and blocks until the turn comes back) and `leave`s when done, or when it
    fails, so that no one waits for it. `abort()` asks every participant to stop at its next step end.
    """

    def __init__(self, names: list[str]):
        self._order = list(names)
        self._active = set(self._order)
        self._holder: str | None = self._order[0] if self._order else None
        self._condition = threading.Condition()
        self.aborted = False

    def _next_after(self, name: str) -> str | None:
        start = self._order.index(name)
        for offset in range(1, len(self._order) + 1):
            candidate = self._order[(start + offset) % len(self._order)]
            if candidate in self._active:
                return candidate
        return None

    def wait_for_turn(self, name: str) -> None:
        with self._condition:
            self._condition.wait_for(lambda: self._holder == name)

    def pass_turn(self, name: str) -> None:
        with self._condition:
            self._holder = self._next_after(name)
            self._condition.notify_all()
            self._condition.wait_for(lambda: self._holder == name)

    def leave(self, name: str) -> None:
        with self._condition:
            self._active.discard(name)
            if self._holder == name:
                self._holder = self._next_after(name)
            self._condition.notify_all()

    def abort(self) -> None:
        self.aborted = True


class TurnTaking(TrainerCallback):
    """At each step end the burst steps aside: from the process's torch state (isolation.RunStream), so that whoever
    waits for it goes first (a probe, a preview's model build), and, with `turns`, from the turn, which goes to the
    next burst. Both are back before the Trainer fetches the next batch, so the next step's data, forward, backward
    and optimizer step all run inside this burst's turn and random stream.

    Added after the callbacks that close a step's measurements (its time, its profile), so that waiting is never
    inside a measurement.
    """

    def __init__(self, turns: Turns | None, name: str, stream: RunStream):
        self.turns, self.name, self.stream = turns, name, stream

    def on_step_end(self, args, state, control, **kwargs):
        with self.stream.stepped_aside():
            if self.turns is not None:
                self.turns.pass_turn(self.name)
        if self.turns is not None and self.turns.aborted:  # another burst failed: the run is over, stop at this step
            control.should_training_stop = True
