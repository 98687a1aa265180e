"""Memory guard: a run that would not fit in the memory its device has free is refused before it trains.

The prediction is the estimate every burst already reports beside its measurement (memory_estimate.py), taken at
each collator's worst step of the run, not only its first: the batches it will really train on (consecutive
examples, epoch after epoch; the longest examples together for a length-grouped sampler, which may bring them
together; the packed rows for best-fit-decreasing), each in the collator's layout (padded B x L, one packed row, one
naive row whose attention sees the whole row).

What the device holds beyond the estimate's live tensors:
- varlen attention checks the model's mask on every pair of tokens inside each segment, once per forward
  (attention.infer_pattern): booleans and index tensors, 13 bytes per pair measured in a forward (rows of 8 padded
  or packed examples of 2k tokens; a naive-concat row of 8k: 11), counted as 16, alive while the first attention
  layer runs. For a naive-concat row every token pair is inside its one segment: 43,700 tokens (8 examples of
  ~5.4k) need 30 GB for it, the 19 GB at which the kernel killed such a run;
- on a CPU a burst's thread keeps the heap its step used (glibc's per-thread arenas hand freed blocks back to the
  same thread, not to the system), so every collator's step tensors stay resident through the run, and its mask
  check comes on top of them; plus a fixed allowance for what a run adds besides (Trainer, the profiler's first
  window, allocator slack): a run grew by 0.1-0.5 GB beyond its estimated tensors at up to 8k tokens per step.
  Measured against this: padded and flatten on 8 examples of ~5.4k tokens (max length 8,192) grew the process by
  5.7 GB, predicted 7.9 GB; a naive-concat row of 16k tokens grew it by 2.9 GB, predicted 5.1 GB.
On a GPU the caching allocator reuses what a step freed, and the bursts run one after another, each freeing its
memory: run peak = the largest burst's peak (its tensors, or its held weights and optimizer state plus the mask
check, whichever is larger). Free memory: a CPU's available RAM (psutil, what the kernel can hand out without
swapping), a GPU's free memory after the CUDA context (`torch.cuda.mem_get_info`, which starts the context).

A refusal says the prediction, what it is made of, and the largest max length and batch size that fit (searched on
the same prediction). It is an estimate, and a run near the limit can still run out: an allocation that fails
mid-burst ends that collator's burst as a partial result with the reason (`is_out_of_memory`, burst.py), never as a
traceback. The kernel may kill a process instead of failing its allocation; refusing up front is what prevents that.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import psutil
import torch

from demo_core.attention.varlen import VARLEN
from demo_core.collators import CollatorSpec
from demo_core.config import RunConfig
from demo_core.errors import DemoInputError
from demo_core.memory import estimate as memory_estimate
from demo_core.memory.plan_request import PlanRequest, training_settings
from demo_core.memory.step import StepShape, TrainingSettings
from demo_core.segments import bucket_shapes
from demo_core.training.distributed import world_size
from demo_core.training.prepared import Prepared
from demo_core.training.turns import takes_turns

MASK_CHECK_BYTES_PER_PAIR = 16  # attention.infer_pattern, per token pair inside a segment (measured 11-13)
CPU_RUN_ALLOWANCE_BYTES = 500_000_000  # what a CPU run adds beyond its tensors (measured 0.1-0.5 GB)
# Batches of a collator whose estimate is computed: the worst by each cost that can set a peak (token slots for the
# linear parts, the quadratic score/mask term, the longest example for the varlen kernel's buckets).
_CANDIDATES_PER_COLLATOR = 3


def is_out_of_memory(error: BaseException) -> bool:
    """An allocation the device refused: CUDA's OutOfMemoryError, the CPU allocator's "can't allocate memory"
    RuntimeError, or Python's MemoryError."""
    return (isinstance(error, (torch.OutOfMemoryError, MemoryError))
            or isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def out_of_memory_reason(error: BaseException) -> str:
    """A partial result's `stop_reason` for an allocation that failed (its first line: the allocator names the size)."""
    text = str(error).strip()
    detail = text.splitlines()[0][:200] if text else type(error).__name__
    return f"out of memory: {detail}"


def available_bytes(device: str) -> int:
    """Free memory the run may use: available RAM on a CPU, free device memory after the CUDA context on a GPU."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    return psutil.virtual_memory().available


def mask_check_bytes(step: StepShape) -> int:
    """What varlen's check of the model's mask pattern holds for one forward of `step` (attention.infer_pattern):
    every token pair of each bucket of similar-length segments, padded to the bucket's longest."""
    pairs = sum(n * length * length for n, length in bucket_shapes(step.attention_segments()))
    return MASK_CHECK_BYTES_PER_PAIR * pairs


def step_shape(spec: CollatorSpec, lengths: Sequence[int]) -> StepShape:
    """The shape the model computes for a batch of examples of `lengths` under this collator's layout."""
    if spec.layout == "padded":
        return StepShape.padded(lengths)
    if spec.layout == "naive":
        # One row without position restarts: attention runs over the whole row, as over one unpadded example.
        return StepShape(1, sum(lengths))
    return StepShape.packed_row(lengths)


def burst_memory_settings(spec: CollatorSpec, run: RunConfig, model_config,
                          context_bytes: int | None = None) -> TrainingSettings:
    """How a burst of this collator trains, for the memory estimate: the run asked as a plan (`PlanRequest.for_run`,
    the planner's one way to the estimator's settings), with the loss its trainer computes (SFTTrainer: TRL's
    chunked LM head) and the CUDA context the burst measured."""
    request = PlanRequest.for_run(run, loss="chunked" if spec.trainer == "sft" else "full").validated()
    return dataclasses.replace(training_settings(request, model_config), context_bytes=context_bytes)


# ---- the batches a run trains on ---------------------------------------------------------------------------------

def _batches(items: list, batch_size: int, steps: int) -> list[list]:
    """The distinct batches of `steps` steps, batching as the Trainer does: in order, epoch after epoch, the last
    batch of an epoch holding what is left."""
    per_epoch = -(-len(items) // batch_size)
    return [items[start:start + batch_size] for start in range(0, min(steps, per_epoch) * batch_size, batch_size)]


def step_lengths(prepared: Prepared, spec: CollatorSpec, batch_size: int, max_length: int) -> list[list[int]]:
    """The example lengths of each distinct forward this collator trains on, at `batch_size` per device and micro-batch
    and examples cut to `max_length`. Packed rows are the run's own at its max length, a bound (full rows) at
    another."""
    steps = prepared.config.steps * prepared.config.grad_accum  # forwards
    if spec.packed_rows:
        if max_length == prepared.config.max_length:
            rows = [list(lengths) for lengths in prepared.rows.packed["seq_lengths"]]
        else:
            rows = [[max_length]] * -(-sum(min(len(ids), max_length) for ids in prepared.examples) // max_length)
        return [[n for row in batch for n in row] for batch in _batches(rows, batch_size, steps)]
    lengths = [min(len(ids), max_length) for ids in prepared.examples]
    if spec.sampler != "sequential":  # a length-grouped sampler may put the longest examples in one batch
        return [sorted(lengths, reverse=True)[:batch_size]]
    return _batches(lengths, batch_size, steps)


def _worst_candidates(spec: CollatorSpec, batches: list[list[int]]) -> list[list[int]]:
    def slots(lengths):
        return sum(lengths) if spec.layout != "padded" else len(lengths) * max(lengths)

    def quadratic(lengths):
        if spec.layout == "padded":
            return len(lengths) * max(lengths) ** 2
        return sum(lengths) ** 2 if spec.layout == "naive" else sum(n * n for n in lengths)

    picked = {tuple(max(batches, key=cost)) for cost in (slots, quadratic, max)}
    return [list(lengths) for lengths in picked][:_CANDIDATES_PER_COLLATOR]


# ---- the prediction -----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CollatorMemory:
    collator: str
    peak_bytes: int  # its burst's peak alone at its worst batch of the run, as the device holds it
    held_bytes: int  # what its burst keeps between steps: weights and optimizer state
    tensor_peak_bytes: int  # the estimate's peak of live tensors at that batch (memory_estimate.py)
    mask_check_bytes: int  # varlen's mask-pattern check at that batch (0 on other attention paths)
    worst_batch_examples: int
    worst_batch_tokens: int  # real tokens of that batch
    worst_batch_slots: int  # positions the model computes on (padded B x L, else the tokens)
    estimate_reliable: bool = True  # False: the activation fit missed its check (the estimate's notes say why)


def burst_peak(device: str, tensor_peak_bytes: int, held_bytes: int, mask_check_bytes: int) -> int:
    """A burst's peak on its own: on a CPU its thread keeps its step's heap when the next forward's mask check runs;
    a GPU's caching allocator reuses it, and the check runs before the step's activations pile up."""
    if device == "cpu":
        return tensor_peak_bytes + mask_check_bytes
    return max(tensor_peak_bytes, held_bytes + mask_check_bytes)


@dataclasses.dataclass(frozen=True)
class RunMemory:
    """A run's predicted peak against the memory its device has free (None: not read, e.g. a preview on a GPU
    server, which must not start a CUDA context)."""

    device: str
    together: bool  # the collators' bursts are all alive at once (a CPU's turns)
    collators: tuple[CollatorMemory, ...]
    available_bytes: int | None

    @property
    def predicted_peak_bytes(self) -> int:
        return combined_peak(self.collators, self.device)

    @property
    def fits(self) -> bool | None:
        return None if self.available_bytes is None else self.predicted_peak_bytes <= self.available_bytes

    def to_dict(self) -> dict:
        return {"predicted_peak_bytes": self.predicted_peak_bytes, "available_bytes": self.available_bytes,
                "fits": self.fits, "device": self.device, "collators_resident_together": self.together,
                "collators": [dataclasses.asdict(c) for c in self.collators]}


def combined_peak(collators: Sequence[CollatorMemory], device: str) -> int:
    """The run's peak: on a CPU every burst's step tensors stay resident (their threads take turns, and each keeps
    its heap), with the largest mask check on top and the run's allowance; on a GPU the largest burst."""
    if not collators:
        return 0
    if device == "cpu":
        return (sum(c.tensor_peak_bytes for c in collators) + max(c.mask_check_bytes for c in collators)
                + CPU_RUN_ALLOWANCE_BYTES)
    return max(c.peak_bytes for c in collators)


def _processes_sharing_memory(device: str) -> int:
    """Ranks of a launcher on this machine share its RAM (each GPU rank has its own device)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device == "cpu" else 1


def collator_memory(prepared: Prepared, spec: CollatorSpec, batch_size: int, max_length: int) -> CollatorMemory:
    """One collator's worst step of the run (the largest of its candidate batches) as the device holds it."""
    settings = burst_memory_settings(spec, prepared.resolved, prepared.source.config)
    sharing = _processes_sharing_memory(prepared.resolved.device)
    worst = None
    for lengths in _worst_candidates(spec, step_lengths(prepared, spec, batch_size, max_length)):
        shape = step_shape(spec, lengths)
        estimate = memory_estimate.estimate_memory_detail(prepared.source.config, shape, settings)
        held = estimate.categories["weights"] + estimate.categories["optimizer"]
        check = mask_check_bytes(shape) if prepared.resolved.attention == VARLEN else 0
        memory = CollatorMemory(spec.name, burst_peak(prepared.resolved.device, estimate.peak_bytes, held, check) * sharing,
                                held * sharing, estimate.peak_bytes * sharing, check * sharing, len(lengths),
                                sum(lengths), shape.token_slots, bool(estimate.reliable))
        if worst is None or memory.peak_bytes > worst.peak_bytes:
            worst = memory
    return worst


def predict(prepared: Prepared, batch_size: int | None = None, max_length: int | None = None,
            available: int | None = None) -> RunMemory:
    """The run's predicted peak, at its own settings or at another global `batch_size` / `max_length` (examples per
    optimizer step over all processes and micro-batches)."""
    config = prepared.config
    # One forward at a time: with gradient accumulation, a micro-batch of the global batch per device.
    per_device = (batch_size or config.batch_size) // (world_size() * config.grad_accum)
    length = max_length or config.max_length
    collators = tuple(collator_memory(prepared, spec, max(per_device, 1), length) for spec in prepared.specs)
    return RunMemory(prepared.resolved.device, takes_turns(prepared.resolved.device) and len(collators) > 1, collators, available)


def preview_memory(prepared: Prepared) -> RunMemory:
    """For the page before Run: free memory is read on a CPU, or on a GPU whose CUDA context already exists."""
    readable = prepared.resolved.device == "cpu" or torch.cuda.is_initialized()
    return predict(prepared, available=available_bytes(prepared.resolved.device) if readable else None)


def _largest(fits, low: int, high: int) -> int | None:
    """The largest value in [low, high] for which `fits` holds (it holds for every smaller one), or None."""
    if not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def largest_settings(prepared: Prepared, available: int) -> dict[str, int | None]:
    """The largest max length (at the run's batch size) and global batch size (at its max length) that fit
    `available`, or None where even the smallest does not."""
    config = prepared.config
    forwards = world_size() * config.grad_accum  # a global batch is this many micro-batches

    def fits(**change) -> bool:
        return predict(prepared, **change).predicted_peak_bytes <= available

    micro = _largest(lambda b: fits(batch_size=b * forwards), 1, config.batch_size // forwards)
    return {"max_length": _largest(lambda n: fits(max_length=n), 2, config.max_length),
            "batch_size": None if micro is None else micro * forwards}


def _gb(count: int) -> str:
    return f"{count / 1e9:.1f} GB" if count >= 1e8 else f"{count / 1e6:.0f} MB"


def refusal(prepared: Prepared, memory: RunMemory) -> str:
    """The message of a run that does not fit: the prediction, its biggest part, and what fits."""
    config = prepared.config
    biggest = max(memory.collators, key=lambda c: c.peak_bytes)
    where = "this machine has available" if memory.device == "cpu" else "the GPU has free"
    parts = [f"this run needs about {_gb(memory.predicted_peak_bytes)} at its peak (estimated), more than the "
             f"{_gb(memory.available_bytes)} {where}: {biggest.collator}'s largest step "
             f"({biggest.worst_batch_examples} examples, {biggest.worst_batch_slots:,} token slots) needs "
             f"{_gb(biggest.peak_bytes)}"
             + (", most of it for varlen attention's check of the model's mask over every token pair of a segment "
                "(a naive-concat row is one segment)" if biggest.mask_check_bytes > biggest.tensor_peak_bytes else "")]
    if memory.together:
        parts.append(f"on a CPU the {len(memory.collators)} collators take turns, so all their models, optimizer "
                     f"states and step memory stay resident together")
    largest = largest_settings(prepared, memory.available_bytes)
    fixes = []
    if largest["max_length"] is not None:
        fixes.append(f"max length {largest['max_length']:,} (at batch size {config.batch_size})")
    if largest["batch_size"] is not None:
        fixes.append(f"batch size {largest['batch_size']} (at max length {config.max_length:,})")
    others = [c for c in memory.collators if c is not biggest]
    if others and combined_peak(others, memory.device) <= memory.available_bytes:
        fixes.append(f"the same run without {biggest.collator}")
    parts.append("what fits: " + ", or ".join(fixes) if fixes else
                 "even batch size 1 at the shortest max length does not fit: the model's weights and optimizer "
                 "state alone are too large for this device")
    return "; ".join(parts)


def refuse_if_too_big(prepared: Prepared) -> RunMemory:
    """Raises DemoInputError, before anything trains, when the run's predicted peak exceeds the free memory. An
    estimate whose activation fit is unreliable refuses nothing: it can be off either way (a chunked Mamba-2 scan,
    MiniMax's lightning-attention blocks), and the burst's own out-of-memory handling ends a run that does not fit."""
    memory = predict(prepared, available=available_bytes(prepared.resolved.device))
    if not memory.fits and all(collator.estimate_reliable for collator in memory.collators):
        raise DemoInputError(refusal(prepared, memory))
    return memory
