"""A run from the server's side: plan its time, hand the GPU part to `gpu.train_on_gpu`, save what comes back.

The time plan (`plan`). ZeroGPU grants the worker the `duration` it asks for and kills it then: asking for too little
loses the run, asking for more than the scheduler allows is refused, and a long request lowers the visitor's place
in ZeroGPU's queue. So the request is the predicted time (`demo_core.training.duration`) times a safety factor, plus the
worker's start, capped by the operator's `PACKING_LAB_MAX_RUN_S`; a run predicted not to fit under the cap is
refused before anything starts, with the number of steps that would fit; and the run stops itself within its time
budget (the duration less the worker's start), keeping what it has. Off ZeroGPU the cap, when set, is each run's
time budget; unset, runs have none.

Saving (`train_and_save`). The history is written here, in the server, from the documents the GPU part hands back
after every collator, never from a worker's memory; so a run that ends early (Stop, its time budget, an error, a
killed worker) is still saved with what it finished, and the upload it used is deleted however it ended.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

from demo_core import DemoInputError, Limits, Prepared
from demo_core.config import env_number
from demo_core.training import duration
from presentation.recipe_script import with_code
from presentation.report import PREDICTION_BASIS
from serving import gpu, stop
from serving.history import RunHistory
from serving.sessions import Session
from serving.uploads import Upload

MAX_RUN_ENV = "PACKING_LAB_MAX_RUN_S"
# ZeroGPU's README shows `duration=120` for a function longer than its 60 s default; what the scheduler grants beyond
# that depends on the visitor's quota. An operator raises it with PACKING_LAB_MAX_RUN_S.
ZEROGPU_DEFAULT_CAP_S = 120
SAFETY = 1.5  # predictions of step time are rough (shared machines, first runs of a model on a device)
WORKER_START_S = 10  # ZeroGPU: fork the worker, create its CUDA context, hand the last document back
SAVED = "saved"  # train_and_save's last event: (SAVED, HistoryEntry, or None when nothing was saved)


def run_time_cap_s() -> float | None:
    return env_number(MAX_RUN_ENV, ZEROGPU_DEFAULT_CAP_S if gpu.ON_ZEROGPU else None)


def _too_long(estimate: duration.RunEstimate, needed_s: float, cap_s: float, start_s: float) -> str:
    per_step_s = sum(estimate.step_s.values()) / len(estimate.step_s)
    fit = estimate.steps_within((cap_s - start_s) / SAFETY)
    shrink = (f"use at most {fit} steps, fewer collators, or a smaller batch size or max length" if fit else
              "use fewer collators, a smaller model, batch size or max length")
    return (f"this run would need about {needed_s:.0f} s ({len(estimate.step_s)} collators × {estimate.steps} steps "
            f"at about {per_step_s:.2f} s each, {PREDICTION_BASIS[estimate.basis]}; plus {estimate.setup_s:.0f} s "
            f"setup per collator), more than the {cap_s:.0f} s a run may take here: {shrink}")


def plan(prepared: Prepared, history: RunHistory, limits: Limits, stop_marker,
         upload: Upload | None) -> gpu.TrainingJob:
    """The job for `gpu.train_on_gpu`, with its GPU duration and time budget; refuses a run that cannot fit."""
    config = prepared.config
    measured = duration.measured_seconds_per_slot((entry.document for entry in history.entries()),
                                                  duration.speed_key(prepared.document_config()))
    estimate = duration.estimate(prepared, measured)
    start_s = WORKER_START_S if gpu.ON_ZEROGPU else 0
    needed_s = start_s + SAFETY * estimate.total_s
    cap_s = run_time_cap_s()
    if cap_s is not None and needed_s > cap_s:
        raise DemoInputError(_too_long(estimate, needed_s, cap_s, start_s))
    gpu_duration_s = math.ceil(needed_s)
    budget_s = gpu_duration_s - start_s if gpu.ON_ZEROGPU else cap_s
    return gpu.TrainingJob(config, limits, str(stop_marker), gpu_duration_s, budget_s, estimate.first_step_s,
                           None if upload is None else str(upload.path), None if gpu.ON_ZEROGPU else prepared)


def train_and_save(job: gpu.TrainingJob, history: RunHistory, session: Session,
                   upload: Upload | None) -> Iterator[tuple]:
    """Yields the GPU part's STEP and RESULT events, then (SAVED, entry), the entry None when the run was stopped
    before its first step (on ZeroGPU: while it waited for a GPU): nothing to save. A run on an upload is private to
    `session`. Once a Stop is asked, RESULT events are no longer handed on: the collators end together after it, and
    the saved entry carries all their results (a page that drew each one, four figures at 1-3 s on busy cores, ended
    the run seconds after the Stop).

    When the GPU part fails (an error, or ZeroGPU's "GPU task aborted" once it killed the worker) the last document it
    handed back is saved before the error is raised; when the consumer closes early (the page went away) a shared
    run's last document is saved too (a private one could only be seen by the session that just ended).
    """
    document, private = None, upload is not None

    def save(reason: str | None = None):
        # each result with its script (presentation/recipe_script.py): the page shows it, the API returns it
        saved = with_code(document if reason is None else {**document, "stop_reason": reason})
        return history.append(saved, session.key, private)

    try:
        with contextlib.closing(gpu.train_on_gpu(job)) as events:
            for event in events:
                if event[0] in (gpu.RESULT, gpu.DONE):
                    document = event[1]
                if event[0] == gpu.STEP or (event[0] == gpu.RESULT and not stop.asked(job.stop_marker)):
                    yield event
    except GeneratorExit:
        if document is not None and not private:
            save("page closed")
        raise
    except Exception:
        if document is not None:
            save("error")
        raise
    finally:
        if upload is not None:
            upload.delete()
    yield SAVED, save() if document["results"] else None
