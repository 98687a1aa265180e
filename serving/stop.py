"""Stopping a run from outside it: a Stop click and a time budget, both seen by the engine between steps.

The engine asks `stop_event.is_set()` after every optimizer step and before every collator; a `threading.Event`
answers that for a run in the asking process. `StopSignal` answers it across processes. On a ZeroGPU Space the
training runs in a worker process forked from the server, where an Event set by the server's Stop handler is never
seen, so a stop is a marker file the worker checks. The same object carries the run's time budget: ZeroGPU kills the
worker when its GPU allocation ends, and whatever the worker had not handed back dies with it, so the run stops
itself while one more step (as long as the longest seen so far) still ends inside the budget.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STOP = "stop"  # someone asked for it (the marker file exists)
TIME_BUDGET = "time budget"  # one more step would outlast the run's time budget


def asked(marker: str | os.PathLike) -> bool:
    """Whether someone asked the run of this stop marker to stop (Stop writes the marker, `StopSignal.set`)."""
    return Path(marker).exists()


class StopSignal:
    """`is_set()` once the marker file exists or the time budget is nearly spent; `reason` says which came first.

    budget_s      seconds from construction the run may use, or None for no limit;
    first_step_s  how long the first step is expected to take, counted from construction (preparing the data and
                  building the first model included): the reserve until a step has been measured.
    """

    def __init__(self, marker: str | os.PathLike, budget_s: float | None = None, first_step_s: float = 0.0):
        self.marker = Path(marker)
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.longest_step_s = first_step_s
        self.reason: str | None = None
        self._last_step_end = time.monotonic()

    def step_done(self) -> None:
        """Called after every step: the time since the previous one (model building included at a collator's first
        step) becomes the reserve when it is the longest so far."""
        now = time.monotonic()
        self.longest_step_s = max(self.longest_step_s, now - self._last_step_end)
        self._last_step_end = now

    def is_set(self) -> bool:
        if self.reason is None:
            if asked(self.marker):
                self.reason = STOP
            elif self.deadline is not None and time.monotonic() + self.longest_step_s >= self.deadline:
                self.reason = TIME_BUDGET
        return self.reason is not None

    def set(self) -> None:
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        self.marker.touch()
