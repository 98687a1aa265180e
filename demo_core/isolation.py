"""A run's numbers never depend on what else the process is doing: torch's process-wide state, one holder at a time.

torch keeps some state per process, not per thread:
- the default generators (CPU, and one per CUDA device) that weight init, dropout, `randperm` samplers and
  checkpointing's replay draw from; Python's `random` and NumPy's, which transformers' `set_seed` seeds with them;
- the default dtype, which transformers sets while it builds a model in another dtype (`from_config(dtype=...)`);
- the intra-op thread count a thread starts with (the count itself is per thread: OpenMP keeps it per thread once
  the thread has run an operator; `torch.set_num_threads` in one thread moves only the default of threads yet to
  start), and the count decides how a parallel reduction splits its sum, so it can change a float's last bits.

A server does several things at once beside a run: the planner's activation probes (its start-up warm-up thread, any
visitor's `/plan`), pre-flight checks and model builds for every preview, the contamination check, the other
collators' bursts of the same run taking turns in their threads. Each of them used to seed, draw from or restore
the global generator from its own thread, under another thread's feet (measured with the app: flatten vs padded
|Δloss| 0.05-0.14 right after start-up, and padded's own losses moved, against 4.8e-7 on a quiet server).

So that state has one holder at a time, through one fair lock (first come, first served), and whoever draws random
numbers, builds a model or runs one holds it:
- `exclusive(seed)`: a one-off job (a model build, a probe fit, a pre-flight or contamination forward) finds the
  generators seeded with `seed` (as `transformers.set_seed` seeds them) and leaves the state as it found it: fork
  and restore, under the lock, so no other thread ever sees the fork.
- `RunStream`: a burst's own random stream. The burst holds it from its model build to its last step, and steps
  aside at every step end (`stepped_aside`): its generator states are saved, the process's are put back, and the
  lock goes to whoever waits (a probe, a preview's build, the next collator's turn) before the burst takes it back
  with its own states. So every draw of the burst (the build, Trainer's `set_seed`, the sampler's permutation,
  dropout masks) comes from its stream alone, and its thread runs with the run's thread count, whatever ran between
  its steps. Step ends come after the step's timer and profiler stop, so waiting there is never measured.

Nesting is allowed (the lock is reentrant): a build inside a burst is `exclusive` inside the burst's stream, and
leaves the stream where it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import threading
from typing import Any, Iterator

import numpy as np
import torch
from transformers import set_seed


class FairLock:
    """A reentrant lock granted in the order threads asked for it (a ticket lock), so that a burst taking it back
    right after stepping aside never jumps ahead of a probe that was already waiting."""

    def __init__(self):
        self._condition = threading.Condition()
        self._next_ticket = self._serving = 0
        self._owner: int | None = None
        self._depth = 0

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._condition:
            if self._owner == me:
                self._depth += 1
                return
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._condition.wait_for(lambda: self._serving == ticket)
            self._owner, self._depth = me, 1

    def release(self) -> None:
        with self._condition:
            if self._owner != threading.get_ident():
                raise RuntimeError("released by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._owner, self._serving = None, self._serving + 1
                self._condition.notify_all()

    @property
    def depth(self) -> int:
        """How many times the calling thread holds it (0: it does not)."""
        with self._condition:
            return self._depth if self._owner == threading.get_ident() else 0

    def __enter__(self) -> "FairLock":
        self.acquire()
        return self

    def __exit__(self, *_) -> None:
        self.release()


PROCESS_STATE_LOCK = FairLock()


def _after_fork_in_child() -> None:
    """A forked child (ZeroGPU's worker is forked from the server) has only the thread that forked: a holder in any
    other thread is gone, so the lock starts free; and a holder may have been mid-build, with transformers' build
    dtype as the default, so the default goes back to torch's own."""
    PROCESS_STATE_LOCK.__init__()
    torch.set_default_dtype(torch.float32)


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclasses.dataclass
class _State:
    """What one holder may change: the generators, the default dtype, and the holding thread's intra-op threads."""

    cpu: torch.Tensor
    cuda: list[torch.Tensor] | None  # None until CUDA is initialised (its generators do not exist before)
    python: Any
    numpy: Any
    default_dtype: torch.dtype
    threads: int

    @classmethod
    def capture(cls) -> "_State":
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(torch.get_rng_state(), cuda, random.getstate(), np.random.get_state(), torch.get_default_dtype(),
                   torch.get_num_threads())  # get_num_threads also settles this thread's count (see set_threads)

    def install(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_default_dtype(self.default_dtype)
        set_threads(self.threads)


def set_threads(count: int | None) -> None:
    """This thread's intra-op threads (None: unchanged). The thread's count is settled first: a thread takes the
    process default at its first operator, which would otherwise overwrite a count set before it."""
    if count is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)


@contextlib.contextmanager
def exclusive(seed: int = 0, threads: int | None = None) -> Iterator[None]:
    """Holds the process's torch state for the block: generators seeded with `seed`, this thread's intra-op threads
    set to `threads` (None: unchanged); everything as it was when the block ends."""
    with PROCESS_STATE_LOCK:
        before = _State.capture()
        try:
            set_seed(seed)
            set_threads(threads)
            yield
        finally:
            before.install()


class RunStream:
    """A burst's own random stream and thread count, swapped into the process whenever the burst holds its state.

    It starts as `transformers.set_seed(seed)` leaves the generators (Trainer reseeds it so when it is built).
    """

    def __init__(self, seed: int, threads: int | None = None):
        self.seed, self.threads = seed, threads
        self._own: _State | None = None
        self._outside: _State | None = None

    def _take(self) -> None:
        self._outside = _State.capture()
        if self._own is None:
            set_seed(self.seed)
        else:
            self._own.install()
        set_threads(self.threads)

    def _give_back(self) -> None:
        self._own = _State.capture()
        self._outside.install()
        self._outside = None

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        with PROCESS_STATE_LOCK:
            self._take()
            try:
                yield
            finally:
                self._give_back()

    @contextlib.contextmanager
    def stepped_aside(self) -> Iterator[None]:
        """Inside `holding`: the stream saved and the lock released for the block (whoever waits goes first), then
        taken back with the stream's states."""
        if PROCESS_STATE_LOCK.depth != 1:
            raise RuntimeError("a run steps aside only from its own outermost hold")
        self._give_back()
        PROCESS_STATE_LOCK.release()
        try:
            yield
        finally:
            PROCESS_STATE_LOCK.acquire()
            self._take()


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
