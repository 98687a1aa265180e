"""Where a training step's time goes: one step of a burst profiled with `torch.profiler`, split two ways.

By **phase** (a partition of the step, marked at its boundaries):
  data       the end of the previous step to `on_step_begin`: the Trainer fetches the batch (collate, host->device)
  forward    the model's forward, loss included (a forward pre-hook to the forward hook)
  backward   the autograd pass (the loss's first backward node to the engine's end-of-backward callback)
  optimizer  the end of backward to the end of `optimizer.step()`: gradient clipping and the update
  other      the rest of the window: input preparation, the LR scheduler, zero_grad, callbacks, Python in between
By **kind of operation** (each operator's self time; on CUDA its kernels' time), the classes of the "model training
anatomy" (tensor contractions, statistical normalizations, element-wise operators) plus what training adds:
  matmul         mm / addmm / bmm / linear ...: the weight matmuls and eager attention's score products
  attention      the attention kernels (SDPA, flash, varlen: scores, softmax and weighted sum fused) and the Python
                 of the attention modules between operators (varlen's segment bookkeeping); eager attention has no
                 kernel: its score products are matmul and its softmax normalization, as in the anatomy page
  normalization  softmax / log-softmax and the loss on it, layer norm, RMS norm (inside a norm module)
  elementwise    activations, residual adds, multiplies, dropout, casts, copies, gathers and scatters (memory-bound
                 work per element: rotary embeddings, varlen's segment gather/scatter, embedding lookups)
  optimizer      every operator in the optimizer phase
  data           every operator in the data phase
  other          operators of no class above (embedding gathers, views, reshapes) and the time no operator covers
A backward node counts in the class of the forward operator that created it (matched by the autograd sequence number),
so an RMS norm's backward is normalization, although it runs multiplies and sums.

Phases on a CPU are **CPU time** between the marks (`_cpu_seconds`: with one intra-op thread, the default of a CPU
burst, the training thread's own, where the forward, the backward and the optimizer all run on a CPU, so a server's
other threads, a planner warming up, count nowhere; with more, the whole process's, the intra-op workers included),
not wall time: on a machine whose cores other processes keep busy, the scheduler takes
the process off a core for whole time slices, and a wall-clock phase absorbs whatever was taken in it (measured: with
both cores of a 2-core machine busy, wall-clock backward read faster than forward, 0.078 s against 0.107 s). CPU
time counts only what the process ran, so other processes cannot move time from one phase to another (with more
than one intra-op thread it also counts what idle OpenMP workers spin between operators; a CPU burst trains with one
unless `threads` says otherwise). `phases` is
that CPU time in shares of the step, in seconds of the step's wall time (so phases still add up to `step_s`);
`phases_wall` the wall-clock phases as the marks measured them, and `phases_cpu_s` the CPU seconds themselves. On
CUDA each mark synchronises the device and the phases are wall time, the device's time (CPU time there measures the
host waiting), so `phases` equals `phases_wall`. Operation classes are the profiler's per-operator times, wall
time on the CPU side: under contention they move more than the phases.

Profiled steps (`profiled_steps`): step 2, the first after the warm-up step, so every burst that trains past the
warm-up has an anatomy, then every `PROFILE_EVERY`-th step, up to `MAX_PROFILED_STEPS`, as long as at least
MIN_TIMED_STEPS steps stay timed. Every burst profiles the same step numbers, so on a CPU, where the bursts take
turns step by step, the collators' profiled steps alternate like their timed steps and sample the same load. The
profiler slows a step (it records every operator: 10-40% on a tiny CPU model), so profiled steps are left out of
the throughput (`Result.timed_step_indices`).

A burst's `time_anatomy` is the centre of its profiled steps (`robust_anatomy`): per phase and per operation class
the median of its share of the step, the shares scaled to add up to one, in seconds of the median profiled step
(profiler included: compare shares, not seconds). One step descheduled by other work on the machine moves a median
of three or five little; `doubts` says in words when the centre still cannot be trusted (the steps disagree, the
backward / forward ratio is outside what a training step does, a single profiled step).
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import threading
import time
from typing import Callable

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile
from transformers import TrainerCallback

# Kineto prints two "USDT ... profiler_start/stop" lines to stderr per profile unless its log level is above them
# (read when the profiler first starts); they would land in the CLI's output.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

logger = logging.getLogger(__name__)

PHASES = ("forward", "backward", "optimizer", "data", "other")
OP_CLASSES = ("matmul", "attention", "normalization", "elementwise", "optimizer", "data", "other")
# When the centre cannot be trusted. A share's median absolute deviation over the profiled steps above this: the
# steps disagree by more than the ±0.10 two identical runs are held to (docs/RESULTS.md). And the backward / forward
# ratios a training step can have: about 2 for full training (the anatomy page: two matmuls per forward one), down
# to about 1 when weights are frozen (only input gradients) and up to 3 with gradient checkpointing (the forward
# again); tiny CPU models measured 1.2-1.7 on an idle machine. Outside the band, other work stalled one phase.
SPREAD_DOUBT = 0.05
PLAUSIBLE_BACKWARD_OVER_FORWARD = (0.75, 4.0)


def backward_over_forward(anatomy: dict, part: str = "phases") -> float | None:
    """A `time_anatomy`'s backward time over its forward time (transformers' "model training anatomy" puts it at
    about 2); `part` "phases_wall" for the wall-clock ratio."""
    phases = anatomy.get(part)
    if not phases or not phases["forward"]:
        return None
    return phases["backward"] / phases["forward"]


def _shares(anatomy: dict, part: str) -> dict[str, float]:
    return {name: seconds / anatomy["step_s"] for name, seconds in anatomy[part].items()}


def _median_shares(anatomies: list[dict], part: str) -> dict[str, float]:
    """Per name, the median of its share over the steps, scaled so that the medians add up to one."""
    medians = {name: statistics.median(_shares(a, part)[name] for a in anatomies) for name in anatomies[0][part]}
    total = sum(medians.values()) or 1.0
    return {name: share / total for name, share in medians.items()}


def share_spread(anatomies: list[dict]) -> float:
    """The largest median absolute deviation of a phase's or operation class's share over the profiled steps."""
    spreads = [0.0]
    for part in ("phases", "ops"):
        centre = {name: statistics.median(_shares(a, part)[name] for a in anatomies) for name in anatomies[0][part]}
        spreads += [statistics.median(abs(_shares(a, part)[name] - share) for a in anatomies)
                    for name, share in centre.items()]
    return max(spreads)


def anatomy_doubts(anatomy: dict, steps: int, spread: float) -> list[str]:
    """Why a centre of `steps` profiled steps should not be taken at face value, in words (empty: no doubt)."""
    doubts = []
    if steps == 1:
        doubts.append("one profiled step: how much its shares vary cannot be seen (a burst of 6 steps or more "
                      "profiles a second)")
    elif spread > SPREAD_DOUBT:
        doubts.append(f"the {steps} profiled steps disagree (a share varies by ±{spread:.2f} of the step from one "
                      f"to the next): other work on the machine; run again")
    ratio = backward_over_forward(anatomy)
    low, high = PLAUSIBLE_BACKWARD_OVER_FORWARD
    if ratio is not None and not low <= ratio <= high:
        doubts.append(f"backward took {ratio:.2f}× the forward, outside the {low:g}–{high:g}× a training step "
                      f"usually takes (about 2×): other work stalled one phase (run again), or the forward does "
                      f"work its backward does not repeat (varlen's mask check on long examples)")
    return doubts


def robust_anatomy(anatomies: list[dict]) -> dict:
    """The `time_anatomy` of a burst: the centre of its profiled steps' anatomies (one per step, in order), with
    `profiled_steps` (how many), `share_spread` and `doubts`."""
    step_s = statistics.median(a["step_s"] for a in anatomies)
    centre = {"step_s": step_s}
    for part in ("phases", "phases_wall", "ops"):
        if all(part in a for a in anatomies):  # saved runs before the CPU-time phases have none
            centre[part] = {name: share * step_s for name, share in _median_shares(anatomies, part).items()}
    if all("phases_cpu_s" in a for a in anatomies):
        centre["phases_cpu_s"] = {name: statistics.median(a["phases_cpu_s"][name] for a in anatomies)
                                  for name in anatomies[0]["phases_cpu_s"]}
    spread = share_spread(anatomies)
    return {**centre, "profiled_steps": len(anatomies), "share_spread": spread,
            "doubts": anatomy_doubts(centre, len(anatomies), spread)}

_profiler_initialized = False


def initialize_profiler() -> None:
    """Starts kineto (torch.profiler's backend) once, from the main thread; a no-op anywhere else.

    Kineto initialises on the first profile, and only when that is in the thread that imported torch; from another
    thread it prints an "ERROR: External init callback must run in same thread as registerClient" line on stderr
    and skips its client's init. Bursts profile in worker threads (the page's, the alternating bursts'), so callers
    on the main thread (the CLI's run, the app's launch) call this first; the first profile costs ~1.5 s anyway.
    """
    global _profiler_initialized
    if _profiler_initialized or threading.current_thread() is not threading.main_thread():
        return
    with profile(activities=[ProfilerActivity.CPU]):
        pass
    _profiler_initialized = True


MARK = "packing-lab mark: "  # zero-length ranges at phase boundaries, in the profiler's own clock
MARKS = ("open", "step_begin", "forward_start", "forward_end", "backward_start", "backward_end", "optimizer_end",
         "close")
NORM_RANGE = "packing-lab: normalization module"
ATTENTION_RANGE = "packing-lab: attention module"
BACKWARD_NODE = "autograd::engine::evaluate_function: "

# Names are matched after stripping the "aten::" namespace and lower-casing.
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum",
                        "_addmm_activation", "mmbackward0", "addmmbackward0", "bmmbackward0"})
ATTENTION_PATTERN = re.compile(r"scaled_dot_product|scaleddotproduct|flash_attention|flashattention|"
                               r"efficient_attention|efficientattention|varlen_attn|cudnn_attention")
NORMALIZATION_PATTERN = re.compile(r"softmax|layer_norm|layernorm|rms_norm|rmsnorm|group_norm|batch_norm|nll_loss|"
                                   r"nlllos|cross_entropy")
ELEMENTWISE_OPS = frozenset({
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "pow", "rsqrt", "sqrt", "exp", "log", "tanh",
    "sigmoid", "silu", "silu_", "gelu", "relu", "relu_", "dropout", "native_dropout", "where", "masked_fill",
    "masked_fill_", "clamp", "clamp_", "mean", "sum", "copy_", "to", "_to_copy", "fill_", "zero_", "cat", "cos", "sin",
    "silu_backward", "gelu_backward", "threshold_backward", "tanh_backward", "sigmoid_backward", "pow_backward",
    "native_dropout_backward", "maximum", "minimum", "abs", "sign", "reciprocal", "addcmul_", "addcdiv_", "lerp_",
    "clone", "contiguous", "zeros", "new_zeros", "zeros_like", "empty_like", "index", "index_put_", "_index_put_impl_",
    "index_copy", "index_copy_", "index_select", "index_add_", "index_select_backward", "gather", "scatter",
    "scatter_add_", "embedding", "embedding_dense_backward", "embedding_backward", "slice_backward", "stack",
})


def _base_name(name: str) -> str:
    return name.split("::", 1)[-1].lower()


def classify_op(name: str, context: str | None = None) -> str:
    """The class of one operator from its name and the context it ran in (see the module docstring).

    `context`: "optimizer" / "data" (its phase), "attention" (inside an attention kernel, or a backward node created
    by one), "normalization" (inside a norm module, or a backward node created by one), or None.
    """
    if context in ("optimizer", "data", "attention", "normalization"):
        return context
    if name == ATTENTION_RANGE:  # its own time: the module's Python between operators
        return "attention"
    base = _base_name(name.removeprefix(BACKWARD_NODE))
    if ATTENTION_PATTERN.search(base):
        return "attention"
    if base in MATMUL_OPS:
        return "matmul"
    if NORMALIZATION_PATTERN.search(base):
        return "normalization"
    if base in ELEMENTWISE_OPS or base.endswith("backward0") and base.removesuffix("backward0") in ELEMENTWISE_OPS:
        return "elementwise"
    return "other"


def _is_norm_module(module: torch.nn.Module) -> bool:
    return isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(module).__name__.endswith("Norm")


def _is_attention_module(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("Attention")


class _ModuleRanges:
    """A profiler range around every call of the norm and attention modules, while installed."""

    def __init__(self, model: torch.nn.Module):
        self._handles = []
        self._open: list = []
        for module in model.modules():
            label = NORM_RANGE if _is_norm_module(module) else ATTENTION_RANGE if _is_attention_module(module) else None
            if label is not None:
                self._handles.append(module.register_forward_pre_hook(self._enter(label)))
                self._handles.append(module.register_forward_hook(self._exit))

    def _enter(self, label: str):
        def hook(*_) -> None:
            scope = record_function(label)
            scope.__enter__()
            self._open.append(scope)
        return hook

    def _exit(self, *_) -> None:  # forward hooks must return None: a value would replace the module's output
        self._open.pop().__exit__(None, None, None)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _cpu_seconds() -> float:
    """CPU time of the threads that compute the step: the calling thread's alone when torch computes there only (one
    intra-op thread), else the process's (other threads of the process then count too: documented above)."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.process_time()


class StepProfiler:
    """Profiles the steps `steps_to_profile` (1-based) of a burst and keeps each one's anatomy in `step_anatomies`
    (in step order); `anatomy` is their centre (`robust_anatomy`), None until a step was profiled.

    Two callbacks, because each window must open after this burst's turn came back and close before it is handed on
    (timing.TurnTaking waits in between): `closer` (added before the turn-taking callback) marks the phases and ends
    the window at the profiled step's end; `opener` (added after it) starts the profiler at the previous step's end.
    On CUDA each mark synchronises first, so a phase is the device's time, not the time to queue its kernels.
    """

    def __init__(self, model: torch.nn.Module, device: str, steps_to_profile: list[int]):
        self.model, self.device, self.steps_to_profile = model, device, set(steps_to_profile)
        self.step_anatomies: list[dict] = []
        self.profiled: list[int] = []  # the steps in `step_anatomies`
        self._profiler: profile | None = None
        self._ranges: _ModuleRanges | None = None
        self._hooks: list = []
        self._started_s = 0.0
        self._cpu_marks: dict[str, float] = {}  # `_cpu_seconds` at each mark (CPU runs)
        self._backward_started = False
        self.opener, self.closer = _Opener(self), _Closer(self)

    @property
    def anatomy(self) -> dict | None:
        return robust_anatomy(self.step_anatomies) if self.step_anatomies else None

    @property
    def profiling(self) -> bool:
        return self._profiler is not None

    def mark(self, name: str) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
        else:
            self._cpu_marks[name] = _cpu_seconds()
        with record_function(MARK + name):
            pass

    def _mark_forward_end(self, _module, _inputs, output) -> None:
        self.mark("forward_end")
        # Every output with a graph: the loss (Trainer), or what TRL's fused LM head returns (the loss is computed
        # from its log-probs outside the model, and some outputs are detached); backward reaches the first one
        # that is part of the loss after at most a few scalar ops.
        self._backward_started = False
        for value in output.values() if isinstance(output, dict) else [output]:
            if torch.is_tensor(value) and value.grad_fn is not None:
                value.grad_fn.register_prehook(self._mark_backward_start)

    def _mark_backward_start(self, _grad_outputs) -> None:
        if self._backward_started:
            return
        self._backward_started = True
        self.mark("backward_start")
        # Runs when the whole backward pass is done (the hook DDP uses to know its gradients are ready).
        torch.autograd.Variable._execution_engine.queue_callback(lambda: self.mark("backward_end"))

    def open(self) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        self._profiler = profile(activities=activities)
        self._cpu_marks = {}
        self._profiler.start()
        self._started_s = time.perf_counter()
        self.mark("open")
        self._ranges = _ModuleRanges(self.model)
        self._hooks = [self.model.register_forward_pre_hook(lambda *_: self.mark("forward_start")),
                       self.model.register_forward_hook(self._mark_forward_end)]

    def close(self, step: int) -> None:
        self.mark("close")
        step_s = time.perf_counter() - self._started_s
        self._remove_hooks()
        self._profiler.stop()
        events = [event for event in self._profiler.events() if event.device_type == torch.autograd.DeviceType.CPU]
        self._profiler = None
        missing = set(MARKS) - {event.name.removeprefix(MARK) for event in events if event.name.startswith(MARK)}
        if missing:  # a model or trainer whose step this module cannot delimit: no anatomy, the run goes on
            logger.warning("time anatomy skipped: profiled step %d had no %s mark", step, ", ".join(sorted(missing)))
            return
        cpu_marks = None if self.device == "cuda" else dict(self._cpu_marks)
        self.step_anatomies.append(anatomy_of_events(events, step_s, self.device == "cuda", cpu_marks))
        self.profiled.append(step)

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._ranges is not None:
            self._ranges.remove()
            self._ranges = None

    def abandon(self) -> None:
        """Ends a window still open when training ended (an error mid-step): a profiler left running would refuse
        the next burst's. A no-op after `close`."""
        self._remove_hooks()
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None


class _Opener(TrainerCallback):
    def __init__(self, owner: StepProfiler):
        self.owner = owner

    def on_step_end(self, args, state, control, **kwargs):  # global_step counts the step that just ended
        if state.global_step + 1 in self.owner.steps_to_profile and not control.should_training_stop:
            self.owner.open()


class _Closer(TrainerCallback):
    def __init__(self, owner: StepProfiler):
        self.owner = owner

    def on_step_begin(self, args, state, control, **kwargs):
        if self.owner.profiling:
            self.owner.mark("step_begin")

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.owner.profiling:
            self.owner.mark("optimizer_end")

    def on_step_end(self, args, state, control, **kwargs):  # global_step already counts this step
        if self.owner.profiling:
            self.owner.close(state.global_step)


# ---- from profiler events to the anatomy ---------------------------------------------------------------------------

def _start_us(event) -> float:
    return event.time_range.start


def _phase_windows(marks: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Each phase as an interval of the profiler clock (µs); `other` is the rest of the window."""
    return {
        "data": (marks["open"], marks["step_begin"]),
        "forward": (marks["forward_start"], marks["forward_end"]),
        "backward": (marks["backward_start"], marks["backward_end"]),
        "optimizer": (marks["backward_end"], marks["optimizer_end"]),
    }


def _context_of(event, phase_of, forward_class_of_sequence: dict[int, str]) -> str | None:
    """The context that fixes the class of `event` and everything under it, from the event or its ancestors."""
    phase = phase_of(_start_us(event))
    if phase in ("data", "optimizer"):
        return phase
    node = event
    while node is not None:
        name = node.name
        if name.startswith("Optimizer."):
            return "optimizer"
        if ATTENTION_PATTERN.search(_base_name(name)):
            return "attention"
        if name == NORM_RANGE:
            return "normalization"
        if name.startswith(BACKWARD_NODE):
            inherited = forward_class_of_sequence.get(node.sequence_nr)
            if inherited in ("attention", "normalization"):
                return inherited
        node = node.cpu_parent
    return None


def classify_events(events: list, phase_of: Callable[[float], str], on_device: bool) -> list[tuple[object, str, float]]:
    """(event, operation class, seconds) for every operator event: its self time (CPU) or self device time (CUDA).

    `phase_of(start_us)` names the phase an event started in. Events are walked in start order, so each forward
    operator's class is known before the backward node it created (same autograd sequence number) is classified.
    """
    classified = []
    forward_class_of_sequence: dict[int, str] = {}
    for event in sorted(events, key=_start_us):
        if event.name.startswith(MARK):
            continue
        seconds = (event.self_device_time_total if on_device else event.self_cpu_time_total) / 1e6
        op_class = classify_op(event.name, _context_of(event, phase_of, forward_class_of_sequence))
        classified.append((event, op_class, seconds))
        if event.sequence_nr >= 0 and not event.name.startswith(BACKWARD_NODE):
            forward_class_of_sequence.setdefault(event.sequence_nr, op_class)
    return classified


def _phase_seconds(marks: dict[str, float], per_second: float) -> dict[str, float]:
    """Seconds per phase from marks in any clock (`per_second` of its units a second); `other` is the rest of the
    window."""
    spans = {phase: high - low for phase, (low, high) in _phase_windows(marks).items()}
    spans["other"] = marks["close"] - marks["open"] - sum(spans.values())
    return {phase: spans[phase] / per_second for phase in PHASES}


def anatomy_of_events(events: list, step_s: float, on_device: bool, cpu_marks: dict[str, float] | None = None) -> dict:
    """The `time_anatomy` document of one profiled step from its profiler events (CPU-side `FunctionEvent`s) and, on
    a CPU, the process's CPU time at each mark (`cpu_marks`, seconds; see the module docstring).

    The time no operator covers (Python between operators, an idle device) counts as `other` operations, so `ops`
    adds up to `step_s` too.
    """
    marks = {event.name.removeprefix(MARK): _start_us(event) for event in events if event.name.startswith(MARK)}
    windows = _phase_windows(marks)

    def phase_of(start_us: float) -> str:
        return next((phase for phase, (low, high) in windows.items() if low <= start_us < high), "other")

    wall = _phase_seconds(marks, 1e6)
    ops_s = dict.fromkeys(OP_CLASSES, 0.0)
    for _, op_class, seconds in classify_events(events, phase_of, on_device):
        ops_s[op_class] += seconds
    ops_s["other"] += max(0.0, step_s - sum(ops_s.values()))
    anatomy = {"step_s": step_s, "phases": wall, "phases_wall": dict(wall), "ops": ops_s}
    if cpu_marks is not None and set(MARKS) <= set(cpu_marks):
        cpu = _phase_seconds(cpu_marks, 1.0)
        total = sum(cpu.values())
        if total > 0:  # the CPU time's shares, in seconds of the step's wall time
            anatomy["phases"] = {phase: seconds / total * sum(wall.values()) for phase, seconds in cpu.items()}
            anatomy["phases_cpu_s"] = cpu
    return anatomy
