"""The part of a run that needs the GPU, shaped for ZeroGPU: `train_on_gpu(job)`.

On a ZeroGPU Space, `spaces.GPU` runs the decorated function in a worker process forked from the server (the
installed `spaces` package, `zero/wrappers.py`): the arguments and every yielded value cross a pipe, pickled; an idle
worker is reused by the next call, its memory a copy of the server's from when it was forked; and the scheduler kills
the worker when the `duration` it was granted runs out. So `train` takes one picklable `TrainingJob`, yields plain
picklable events, keeps nothing the server needs (the server saves the history and deletes the upload from what it is
handed), polls the session's stop marker, and stops itself within its time budget. `spaces.GPU(duration=callable)`
calls the callable with the decorated function's own arguments (`static_duration` in the same file), so the duration
asked for is the job's. Off ZeroGPU `spaces.GPU` returns `train` unchanged and it runs in the server's thread.

Events: (STEP, collator, step, steps) after every step; (RESULT, document so far) after every collator; (DONE,
document) last, its `stop_reason` None, "stop" or "time budget".
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Iterator

import demo_core
from demo_core import Limits, RunConfig
from serving.errors import user_errors
from serving.stop import StopSignal

try:  # ZeroGPU on Hugging Face Spaces; `spaces` is a no-op elsewhere, and optional off Spaces
    import spaces
    from spaces.config import Config as _SpacesConfig

    ON_ZEROGPU = _SpacesConfig.zero_gpu
except ImportError:
    spaces, ON_ZEROGPU = None, False

STEP, RESULT, DONE = "step", "result", "done"


@dataclasses.dataclass(frozen=True)
class TrainingJob:
    """Everything the GPU part needs, picklable (it crosses into ZeroGPU's worker)."""

    config: RunConfig
    limits: Limits
    stop_marker: str  # the session's stop marker file (`serving.sessions`)
    gpu_duration_s: int  # what ZeroGPU is asked for
    budget_s: float | None  # training time before the run stops itself; None: no limit
    first_step_s: float  # the predicted setup + first step: the stop reserve until a step has been measured
    dataset_file: str | None = None  # an upload's server path: read here, never recorded
    # The server's own preparation of the run, handed over off ZeroGPU so that a click prepares once; None on
    # ZeroGPU, where the worker prepares its own (a Prepared holds a model source that need not pickle).
    prepared: demo_core.Prepared | None = dataclasses.field(default=None, compare=False, repr=False)


def requested_duration_s(job: TrainingJob) -> int:
    return job.gpu_duration_s


def _train_in_thread(prepared: demo_core.Prepared, signal: StopSignal, events: queue.Queue) -> threading.Thread:
    """The engine reports through callbacks, and a generator can only yield from its own frame: the engine trains in
    a thread and hands its events over a queue (an exception as ("error", exception))."""
    def work():
        results = []

        def progress(name: str, step: int, steps: int) -> None:
            signal.step_done()
            events.put((STEP, name, step, steps))

        def on_result(result: demo_core.Result) -> None:
            results.append(result)
            events.put((RESULT, prepared.comparison(results).to_dict()))

        try:
            comparison = demo_core.run_comparison(prepared, progress=progress, stop_event=signal, on_result=on_result)
            document = comparison.to_dict()
            # Why it was cut short (a Stop, the time budget, or the engine's own: out of memory); a run that
            # finished all its steps was stopped by nothing.
            reason = signal.reason or document.get("stop_reason") if document["partial"] else None
            events.put((DONE, {**document, "stop_reason": reason}))
        except BaseException as error:  # handed to the generator, which raises it
            events.put(("error", error))

    worker = threading.Thread(target=work, name="packing-lab-run", daemon=True)
    worker.start()
    return worker


def train(job: TrainingJob) -> Iterator[tuple]:
    signal = StopSignal(job.stop_marker, job.budget_s, job.first_step_s)  # the budget counts from here
    prepared = job.prepared or demo_core.prepare(job.config, job.limits, dataset_file=job.dataset_file)
    events: queue.Queue = queue.Queue()
    worker = _train_in_thread(prepared, signal, events)
    finished = False
    try:
        while not finished:
            event = events.get()
            if event[0] == "error":
                raise event[1]
            finished = event[0] == DONE
            yield event
    finally:
        if not finished:
            signal.set()  # closed early (the page went away, or ZeroGPU stops the worker): stop after this step
        worker.join()  # one training job at a time: the queue slot frees only when the engine is done


train_on_gpu = user_errors(train) if spaces is None else spaces.GPU(duration=requested_duration_s)(user_errors(train))
