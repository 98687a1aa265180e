"""Turns that make bursts alternate, so that their timings can be compared on a shared machine.

On a shared CPU the same step can take 2-3x longer from one minute to the next. Two defences: robust statistics
(step_statistics.py) and alternation here: `Turns` passes a single turn between the bursts' threads at step boundaries, so collators' steps
  run ABAB... and every collator samples the same machine load, while each remains a real Trainer run. Only the
  thread holding the turn computes; the others wait in `TurnTaking.on_step_end`, where each burst also steps aside
  from the process's torch state (isolation.py).
"""

from __future__ import annotations

import threading

from transformers import TrainerCallback

from demo_core.isolation import RunStream


def takes_turns(device: str) -> bool:
    """Whether the collators' bursts alternate step by step on this device. On a CPU they do: a CPU is often shared
    (a Space, a laptop, CI), and collators run minutes apart would see different loads. On a GPU they run one after
    the other: a GPU is dedicated, and its peak memory per phase (max_memory_allocated) would otherwise include the
    other collators' resident models and optimizer state."""
    return device == "cpu"


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
