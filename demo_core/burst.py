"""One training burst: a fresh model, one collator, `steps` optimizer steps with the Hugging Face Trainer.

`StepRecorder` (a TrainerCallback) times each optimizer step between `on_step_begin` and `on_step_end`, after a
device synchronisation, so the time covers forward, backward and the optimizer step of exactly that batch; the
collator's own timing covers batch building, which the Trainer does before `on_step_begin`. `anatomy.StepProfiler`
profiles one step (the time anatomy); with `turns` (timing.Turns) the burst takes turns with other bursts' threads
at every step end.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import tempfile
import threading
import time
from typing import Callable

import torch
from transformers import PrinterCallback, Trainer, TrainerCallback

from . import memory_estimate, memory_measure
from .anatomy import PROFILED_STEP, StepProfiler
from .collators import BatchStats, CollatorSpec
from .distributed import merge_ranks
from .lora_burst import with_lora
from .models import ModelSource
from .results import Result
from .timing import Turns, TurnTaking
from .trainers import TrainingRows, build_trainer, make_optimizer
from .work import WorkModel, step_flops

ProgressFn = Callable[[str, int, int], None]  # (collator, step done, total steps)


@dataclasses.dataclass(frozen=True)
class BurstSettings:
    steps: int
    batch_size: int
    max_length: int
    learning_rate: float
    optimizer: str  # "adamw" | "sgd"
    precision: str  # "fp32" | "bf16" | "fp16"
    device: str  # "cpu" | "cuda"
    seed: int
    gradient_checkpointing: bool = False
    lora_rank: int = 0  # 0: full fine-tune (lora_burst.py)
    lora_targets: tuple[str, ...] = ("all-linear",)
    qlora: bool = False


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class StepRecorder(TrainerCallback):
    """Records per-step wall time and the batch each step consumed; `stopped_early` once StopBetweenSteps ended it."""

    def __init__(self, collator, device: str, total_steps: int, name: str, progress: ProgressFn | None):
        # `collator` is the RecordingCollator the trainer calls: each step pops the BatchStats of the batch it ate.
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
        self.batches.append(self.collator.pending_stats.popleft())
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
                    attention: str, settings: BurstSettings) -> tuple[dict, int | None]:
    """(the result's `memory` report, peak bytes) for the batch that step 1 measured."""
    lengths = first_batch.lengths
    if spec.layout == "padded":
        step = memory_estimate.StepShape.padded(lengths)
    elif spec.layout == "naive":
        # One row without position restarts: attention runs over the whole row, as over one unpadded example.
        step = memory_estimate.StepShape(1, sum(lengths))
    else:
        step = memory_estimate.StepShape.packed_row(lengths)
    measured = recorder.measured or {}
    estimate = memory_estimate.estimate_memory_detail(source.config, step, memory_estimate.TrainingSettings(
        precision=settings.precision, optimizer=settings.optimizer, attention=attention,
        gradient_checkpointing=settings.gradient_checkpointing, device_type=settings.device,
        context_bytes=measured.get("context"),
        loss="trl-fused" if spec.trainer == "sft" else "model",  # SFTTrainer computes the loss from a fused LM head
        lora_rank=settings.lora_rank, lora_targets=settings.lora_targets, quantized_base=settings.qlora,
    ))
    # A CPU process has no allocator peak to read (RSS only grows): there the peak is the live tensors at the end of
    # the forward, when saved activations peak, as measured (memory_measure.PEAK_KINDS says so in words).
    peak_bytes, peak_moment, at_peak = memory_measure.measured_peak(settings.device, measured, recorder.peaks)
    report = memory_measure.memory_report(estimate.categories, measured, peak_bytes, peak_moment)
    report["peak_kind"] = memory_measure.PEAK_KINDS[settings.device]
    report["measured_at_peak"] = at_peak
    report["estimated_peak_bytes"] = estimate.peak_bytes
    report["estimated_peak_moment"] = estimate.peak_moment
    report["estimated_at_peak"] = memory_estimate.live_by_moment(estimate.categories,
                                                                 estimate.temporary_terms)[estimate.peak_moment]
    report["phase_peaks"] = dict(recorder.peaks.peaks)
    return report, peak_bytes


def train_and_record(trainer: Trainer, source: ModelSource, recorder: StepRecorder, memory_recorder: MemoryRecorder,
                     profiler: StepProfiler, spec: CollatorSpec, attention: str, settings: BurstSettings) -> Result:
    """Trains, then turns what the callbacks recorded into this rank's `Result`."""
    trainer.remove_callback(PrinterCallback)  # it prints the end-of-training metrics dict to stdout
    trainer.train()
    memory_report, peak_memory_bytes = memory_of_burst(source, memory_recorder, recorder.batches[0], spec,
                                                       attention, settings)
    steps_done = len(recorder.step_times_s)
    work = WorkModel.of(trainer.model)
    return Result(
        collator=spec.name,
        attention=attention,
        device=settings.device,
        precision=settings.precision,
        steps=steps_done,
        losses=trainer.step_losses[:steps_done],
        step_times_s=recorder.step_times_s,
        step_real_tokens=[b.real_tokens for b in recorder.batches],
        step_padded_slots=[b.padded_slots for b in recorder.batches],
        step_examples=[b.examples for b in recorder.batches],
        step_collate_s=[b.collate_s for b in recorder.batches],
        peak_memory_bytes=peak_memory_bytes,
        peak_memory_kind=memory_report["peak_kind"],
        memory=memory_report,
        partial=recorder.stopped_early,
        world_size=trainer.args.world_size,
        step_work_flops=[step_flops(work, b.lengths, spec.layout, attention) for b in recorder.batches],
        profiled_step=PROFILED_STEP if profiler.anatomy is not None else None,
        time_anatomy=profiler.anatomy,
    )


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Frees what a burst or run left behind and hands it back to the system, so the next one starts level.

    gc first (the model, optimizer and Trainer form cycles), then the CUDA cache, then glibc's trim: without it
    glibc keeps the freed heap of a run (~300 MB for a tiny CPU run) and a server's resident memory steps up by a
    third over its first few runs (benchmarks/soak.py) even though no object survives.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def run_burst(source: ModelSource, rows: TrainingRows, spec: CollatorSpec, attention: str,
              settings: BurstSettings, progress: ProgressFn | None = None,
              stop_event: threading.Event | None = None, turns: Turns | None = None) -> Result:
    """One collator's burst on a fresh model seeded like every other collator's, through the trainer its spec names.

    With `turns`, the caller holds this burst's turn when it calls, and the burst hands it on at every step end.
    The caller releases the memory the burst leaves behind (`release_memory`): after each burst when they run one
    after another, once after all of them when they take turns (all their models are alive together anyway, and
    gc plus malloc_trim cost ~0.25 s a burst, paid one after another while the run ends).
    """
    model = source.build(attention, torch.float32, seed=settings.seed)
    # transformers turns packing detection (from position_ids) off when a cache is in use, and `use_cache` defaults
    # to True even in train mode: without this a packed batch would attend across examples.
    model.config.use_cache = False
    if settings.lora_rank:
        model = with_lora(model, settings)
    optimizer = make_optimizer(model, settings)
    with tempfile.TemporaryDirectory(prefix="packing-lab-") as output_dir:
        trainer, collator = build_trainer(spec, model, source.tokenizer, rows, settings, output_dir, optimizer)
        recorder = StepRecorder(collator, settings.device, settings.steps, spec.name, progress)
        memory_recorder = MemoryRecorder(model, settings.device)
        profiler = StepProfiler(model, settings.device)
        # Order matters: every measurement of a step closes before the turn is handed on, and the profiled window
        # opens only once the turn is back (see StepProfiler).
        for callback in (recorder, memory_recorder, profiler.closer,
                         *([TurnTaking(turns, spec.name)] if turns is not None else []), profiler.opener,
                         *([StopBetweenSteps(recorder, stop_event)] if stop_event is not None else [])):
            trainer.add_callback(callback)
        try:
            result = train_and_record(trainer, source, recorder, memory_recorder, profiler, spec, attention, settings)
        finally:
            profiler.abandon()
    del trainer, model, optimizer, memory_recorder, profiler
    return merge_ranks(result)
