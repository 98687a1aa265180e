"""One training burst: a fresh model, one collator, `steps` optimizer steps with the Hugging Face Trainer.

`StepRecorder` (a TrainerCallback) times each optimizer step between `on_step_begin` and `on_step_end`, after a
device synchronisation, so the time covers forward, backward and the optimizer step of exactly that batch; the
collator's own timing covers batch building, which the Trainer does before `on_step_begin`. `anatomy.StepProfiler`
profiles a few steps (the time anatomy). The burst holds the process's torch state with its own random stream
(isolation.RunStream) from its model build to its end and steps aside at every step end, where, with `turns`
(timing.Turns), it also takes turns with other bursts' threads. A step that runs out of memory ends the burst as a
partial result that says so (`stop_reason`), not as a traceback.
"""

from __future__ import annotations

import tempfile
import threading
import time
from typing import Callable

import torch
from transformers import PrinterCallback, Trainer, TrainerCallback

from demo_core.caches import release_memory
from demo_core.collators import BatchStats, CollatorSpec
from demo_core.config import RunConfig
from demo_core.isolation import RunStream
from demo_core.memory import estimate as memory_estimate
from demo_core.memory import measure as memory_measure
from demo_core.memory.planner import per_device_estimate
from demo_core.models.sources import ModelSource
from demo_core.results import Result
from demo_core.step_statistics import profiled_steps
from demo_core.throughput.work import WorkModel, step_flops
from demo_core.training.anatomy import StepProfiler
from demo_core.training.distributed import merge_ranks, world_size
from demo_core.training.lora import with_lora
from demo_core.training.memory_guard import burst_memory_settings, is_out_of_memory, out_of_memory_reason, step_shape
from demo_core.training.trainers import TrainingRows, build_trainer
from demo_core.training.turns import Turns, TurnTaking

ProgressFn = Callable[[str, int, int], None]  # (collator, step done, total steps)


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class StepRecorder(TrainerCallback):
    """Records per-step wall time and the batch each step consumed; `stopped_early` once StopBetweenSteps ended it."""

    def __init__(self, collator, device: str, total_steps: int, name: str, progress: ProgressFn | None):
        # `collator` is the RecordingCollator the trainer calls: each step pops the BatchStats of the batches it ate.
        self.collator, self.device, self.total_steps, self.name = collator, device, total_steps, name
        self.progress = progress
        self.step_times_s: list[float] = []
        self.batches: list[BatchStats] = []
        self.stopped_early = False
        self._started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        _synchronize(self.device)
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        _synchronize(self.device)
        self.step_times_s.append(time.perf_counter() - self._started)
        self.batches.append(self.collator.step_stats.popleft())
        if self.progress is not None:
            self.progress(self.name, len(self.step_times_s), self.total_steps)


class StopBetweenSteps(TrainerCallback):
    """Ends the burst at a step end once a stop is asked for. The last callback of a step, after TurnTaking: a burst
    that waited for its turn while Stop came ends as the turn comes back, instead of taking one more step (with 7
    collators, every Stop ran 6 more steps before)."""

    def __init__(self, recorder: StepRecorder, stop_event: threading.Event):
        self.recorder, self.stop_event = recorder, stop_event

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop_event.is_set() and state.global_step < state.max_steps:
            self.recorder.stopped_early = True
            control.should_training_stop = True


class MemoryRecorder(TrainerCallback):
    """Measures memory per category during the burst (see memory_measure.py for what each number is).

    Saved activations are metered in step 1 only: the saved-tensor hook runs Python for every saved tensor, and
    step 1 is the warm-up step that throughput leaves out anyway. Weights, gradients and optimizer state are summed
    from tensors right after step 1's optimizer step (before the Trainer zeroes the gradients). Phase peaks (end of
    forward, end of backward, after the optimizer step) are marked on every step.
    """

    def __init__(self, model: torch.nn.Module, device: str):
        self.model = model
        self.meter = memory_measure.SavedActivationMeter(model)
        self.peaks = memory_measure.PhasePeaks(device)
        self.measured: dict | None = None
        self._forward_hook = model.register_forward_hook(self._mark_forward_end)

    # Forward hooks must return None: a returned value would replace the model's output.
    def _mark_forward_end(self, *_) -> None:
        self.peaks.mark("forward_end")

    def _stop_meter(self, *_) -> None:
        self.meter.stop()

    def on_step_begin(self, args, state, control, **kwargs):
        self.peaks.reset()
        if state.global_step == 0:
            self.meter.start()
            # Hooked after the peak hook, so the meter stops at the end of the same forward (loss included).
            self._meter_hook = self.model.register_forward_hook(self._stop_meter)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.peaks.mark("backward_end")

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.peaks.mark("optimizer_step")
        if self.measured is None:
            self._meter_hook.remove()
            snapshot = memory_measure.device_memory_snapshot(self.peaks.device)
            self.measured = memory_measure.measured_categories(self.model, optimizer, self.meter, snapshot)

    def on_train_end(self, args, state, control, **kwargs):
        self._forward_hook.remove()


def memory_of_burst(source: ModelSource, recorder: "MemoryRecorder", first_batch: BatchStats, spec: CollatorSpec,
                    run: RunConfig) -> tuple[dict, int | None]:
    """(the result's `memory` report, peak bytes) for the batch that step 1 measured (its first micro-batch).

    Under FSDP the estimate is the planner's for this many processes (`plan --gpus N --shard fsdp`): this process's
    shards of weights, gradients and optimizer state, its own activations; `unsharded_estimate` is one full copy.
    """
    measured = recorder.measured or {}
    step = step_shape(spec, first_batch.micro_lengths[0])
    training = burst_memory_settings(spec, run, source.config, context_bytes=measured.get("context"))
    unsharded = memory_estimate.estimate_memory_detail(source.config, step, training)
    estimate = per_device_estimate(source.config, step, training, world_size(), "fsdp") if run.fsdp else unsharded
    # A CPU process has no allocator peak to read (RSS only grows): there the peak is the live tensors at the end of
    # the forward, when saved activations peak, as measured (memory_measure.PEAK_KINDS says so in words).
    peak_bytes, peak_moment, at_peak = memory_measure.measured_peak(run.device, measured, recorder.peaks)
    report = memory_measure.memory_report(estimate.categories, measured, peak_bytes, peak_moment)
    report["peak_kind"] = memory_measure.PEAK_KINDS[run.device]
    report["measured_at_peak"] = at_peak
    report["estimated_peak_bytes"] = estimate.peak_bytes
    report["estimated_peak_moment"] = estimate.peak_moment
    live = memory_estimate.live_by_moment(estimate.categories, estimate.temporary_terms)
    report["estimated_at_peak"] = live[estimate.peak_moment]
    # What the chart compares: both sides at one moment of the step (memory_measure.compared_moment).
    report["compared_moment"] = memory_measure.compared_moment(run.device, peak_moment)
    report["estimated_at_compared"] = live.get(report["compared_moment"], report["estimated_at_peak"])
    report["phase_peaks"] = dict(recorder.peaks.peaks)
    if run.fsdp:
        report["shard"] = "fsdp"
        report["unsharded_estimate"] = unsharded.categories
    return report, peak_bytes


def _train(trainer: Trainer, profiler: StepProfiler) -> str | None:
    """Trains; None, or the reason training ended early because memory ran out (the failed step is dropped)."""
    try:
        trainer.train()
        return None
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        reason = out_of_memory_reason(error)
    # Outside the except block: the traceback, and the tensors its frames hold, can be freed now.
    profiler.abandon()
    if trainer.optimizer is not None:
        trainer.optimizer.zero_grad(set_to_none=True)
    release_memory()
    return reason


def train_and_record(trainer: Trainer, source: ModelSource, recorder: StepRecorder, memory_recorder: MemoryRecorder,
                     profiler: StepProfiler, spec: CollatorSpec, run: RunConfig) -> Result:
    """Trains, then turns what the callbacks recorded into this rank's `Result` (partial, with a `stop_reason`, when
    memory ran out mid-burst)."""
    trainer.remove_callback(PrinterCallback)  # it prints the end-of-training metrics dict to stdout
    out_of_memory = _train(trainer, profiler)
    steps_done = len(recorder.step_times_s)
    # The batch step 1 trained on, or the one it ran out of memory on (still pending in the collator).
    first_batch = recorder.batches[0] if recorder.batches else next(iter(recorder.collator.pending_stats), None)
    memory_report, peak_memory_bytes = ({}, None) if first_batch is None else \
        memory_of_burst(source, memory_recorder, first_batch, spec, run)
    work = WorkModel.of(trainer.model)
    return Result(
        collator=spec.name,
        attention=run.attention,
        device=run.device,
        precision=run.precision,
        steps=steps_done,
        losses=trainer.step_losses[:steps_done],
        step_times_s=recorder.step_times_s,
        step_real_tokens=[b.real_tokens for b in recorder.batches],
        step_trained_tokens=[b.trained_tokens for b in recorder.batches],
        step_padded_slots=[b.padded_slots for b in recorder.batches],
        step_examples=[b.examples for b in recorder.batches],
        step_collate_s=[b.collate_s for b in recorder.batches],
        peak_memory_bytes=peak_memory_bytes,
        peak_memory_kind=memory_report["peak_kind"],
        memory=memory_report,
        partial=recorder.stopped_early or out_of_memory is not None,
        world_size=trainer.args.world_size,
        step_work_flops=[sum(step_flops(work, lengths, spec.layout, run.attention) for lengths in b.micro_lengths)
                         for b in recorder.batches],
        profiled_step=profiler.profiled[0] if profiler.profiled else None,
        time_anatomy=profiler.anatomy,
        profiled_steps=profiler.profiled,
        step_anatomies=profiler.step_anatomies,
        stop_reason=out_of_memory,
        effective_batch_size=(trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
                              * trainer.args.world_size),
    )


def run_burst(source: ModelSource, rows: TrainingRows, spec: CollatorSpec, run: RunConfig, progress: ProgressFn | None = None,
              stop_event: threading.Event | None = None, turns: Turns | None = None) -> Result:
    """One collator's burst on a fresh model seeded like every other collator's, through the trainer its spec names.

    With `turns`, the caller holds this burst's turn when it calls, and the burst hands it on at every step end.
    The caller releases the memory the burst leaves behind (`release_memory`): after each burst when they run one
    after another, once after all of them when they take turns (all their models are alive together anyway, and
    gc plus malloc_trim cost ~0.25 s a burst, paid one after another while the run ends).
    """
    stream = RunStream(run.seed, run.threads)
    with stream.holding():
        result = _run_burst(source, rows, spec, run, progress, stop_event, turns, stream)
    return merge_ranks(result)


def _run_burst(source: ModelSource, rows: TrainingRows, spec: CollatorSpec, run: RunConfig,
               progress: ProgressFn | None, stop_event: threading.Event | None, turns: Turns | None,
               stream: RunStream) -> Result:
    model = source.build(run.attention, torch.float32, seed=run.seed)
    # transformers turns packing detection (from position_ids) off when a cache is in use, and `use_cache` defaults
    # to True even in train mode: without this a packed batch would attend across examples.
    model.config.use_cache = False
    if run.lora_rank:
        model = with_lora(model, run)
    with tempfile.TemporaryDirectory(prefix="packing-lab-") as output_dir:
        trainer, collator = build_trainer(spec, model, source.tokenizer, rows, run, output_dir)
        recorder = StepRecorder(collator, run.device, run.steps, spec.name, progress)
        memory_recorder = MemoryRecorder(model, run.device)
        profiler = StepProfiler(model, run.device, profiled_steps(run.steps))
        # Order matters: every measurement of a step closes before the burst steps aside (and hands the turn on),
        # a profiled window opens only once both are back (see StepProfiler), and a stop is read last, so that a
        # burst that waited for its turn while Stop came ends there instead of taking one more step.
        for callback in (recorder, memory_recorder, profiler.closer, TurnTaking(turns, spec.name, stream),
                         profiler.opener, *([StopBetweenSteps(recorder, stop_event)] if stop_event is not None else [])):
            trainer.add_callback(callback)
        try:
            return train_and_record(trainer, source, recorder, memory_recorder, profiler, spec, run)
        finally:
            profiler.abandon()
