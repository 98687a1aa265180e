"""Which steps of a burst are timed and which are profiled, and the robust statistics of the timed ones.

On a shared CPU the same step can take 2-3x longer from one minute to the next, and a single descheduled step can be
10x slower. A burst's throughput comes from the time per token slot of its timed steps (not step 1, the warm-up, and
not the profiled ones, which the profiler slows), each step weighted by its slots, and trimmed (`robust_summary`: the
mean of the middle half), not a sum that one slow step dominates; its spread is the interquartile range. A few steps
spread over the burst are profiled (training/anatomy.py), so that the time anatomy is a median too.
"""

from __future__ import annotations

import math
from typing import Iterable

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


FIRST_PROFILED_STEP = 2  # step 1 is the warm-up; the first profiled step is the next one
PROFILE_EVERY = 4  # then steps 6, 10, 14, 18: spread over the burst, three timed steps between two profiled ones
MAX_PROFILED_STEPS = 5  # a median of five shrugs off two steps slowed by other work


def profiled_steps(steps: int) -> list[int]:
    """The 1-based steps a burst of `steps` steps profiles (see the module docstring)."""
    chosen: list[int] = []
    for step in range(FIRST_PROFILED_STEP, steps + 1, PROFILE_EVERY):
        timed_left = steps - 1 - (len(chosen) + 1)
        if len(chosen) == MAX_PROFILED_STEPS or (chosen and timed_left < MIN_TIMED_STEPS):
            break
        chosen.append(step)
    return chosen
