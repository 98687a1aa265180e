"""Stop ends a multi-collator run at once: after the stop no collator takes another step and none builds its model.

Counted in steps, not seconds (benchmarks/stop_latency.py measures the seconds: 7 collators, 7-11 s before, under
a second now, on a shared 2-core CPU).
"""

from __future__ import annotations

import threading

import pytest

from demo_core import RunConfig, run_comparison

COLLATORS = ("padded", "flatten", "bfd")


def _stopped_after(total_steps: int):
    """The run stopped once its collators have taken `total_steps` steps between them, and the steps that ended
    after the stop."""
    stop = threading.Event()
    done: list[str] = []
    after_stop: list[str] = []

    def progress(collator: str, step: int, steps: int) -> None:
        (after_stop if stop.is_set() else done).append(collator)
        if len(done) == total_steps:
            stop.set()

    config = RunConfig(model="tiny-llama", dataset="flan-like", samples=48, steps=20, batch_size=4,
                       collators=COLLATORS)
    return run_comparison(config, progress=progress, stop_event=stop), after_stop


@pytest.mark.parametrize("total_steps, steps_per_collator", [
    (4, {"padded": 2, "flatten": 1, "bfd": 1}),  # every model built and training: they alternate p, f, b, p
    (1, {"padded": 1}),  # stopped in padded's first step: flatten and bfd never build a model
])
def test_after_a_stop_no_collator_takes_another_step(total_steps, steps_per_collator):
    comparison, after_stop = _stopped_after(total_steps)
    assert after_stop == []
    assert {result.collator: result.steps for result in comparison.results} == steps_per_collator
    assert comparison.partial and all(result.partial for result in comparison.results)
