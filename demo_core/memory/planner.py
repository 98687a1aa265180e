"""Will this fine-tune fit? Memory per device for real model sizes, answered without training.

Every number comes from memory_estimate.py, the code path that estimates each burst: a preset with a run's settings
gives that run's own estimate, byte for byte. The planner adds what a run here never does: configs of real models
(shipped in models/configs/, or any hub id, its config.json alone), LoRA / QLoRA, 8-bit AdamW, Adafactor and pure bf16,
N GPUs with ZeRO / FSDP sharding, and the largest batch size and sequence length that fit.

Three numbers per plan, each for what it predicts (memory_reserve.py):
    total_bytes        live tensors at the step's peak: torch.cuda.max_memory_allocated
    reserved_bytes     + the caching allocator's rounding, workspaces and cache: torch.cuda.max_memory_reserved
    device_used_bytes  + the CUDA context and NCCL's buffers: what nvidia-smi shows the process using
"Fits", the largest batch and the longest sequence are decided on device_used_bytes + margin_bytes, the top of the
range the published measurements behind the reserve and the context allow.

Defaults are what people run. A full fine-tune: Trainer(bf16=True), fp32 master weights, no checkpointing, the
model's own loss. LoRA / QLoRA: what TRL's SFTTrainer does with a peft config, the base loaded in bf16 (or 4 bits),
fp32 adapters, gradient checkpointing on, the chunked LM-head loss. Each is a setting (`base_dtype`,
`adapter_dtype`, `gradient_checkpointing`, `loss`, `optimizer_impl`), resolved in the plan's `request`.

Sharding, per device. Data parallel: each device runs its own micro-batch of `batch_size`, so activations are never
divided.
    none (DDP)    every device holds everything; DDP's gradient buckets are a second copy of the gradients
                  (PyTorch's default gradient_as_bucket_view=False), alive the whole step
    zero1         optimizer state / N
    zero2         + gradients / N
    zero3, fsdp   + weights / N, and two decoder layers' full weights gathered during forward and backward
                  (the layer computing and the one prefetched)
    fsdp-no-shard FSDP's NO_SHARD: every device holds everything, gradients all-reduced in place (no bucket copy)
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Callable, Sequence

from transformers import PretrainedConfig

from demo_core.caches import registered
from demo_core.data import loading as data
from demo_core.errors import DemoInputError
from demo_core.memory.estimate import StepPeak, estimate_memory_detail, live_by_moment
from demo_core.memory.heads import model_head
from demo_core.memory.parameters import param_facts, state_tensor_sizes
from demo_core.memory.plan_request import (
    FIT_BASIS,
    GIB,
    GPU_SIZES_GB,
    PREDICTS,
    PlanRequest,
    load_config,
    resolved_loss,
    training_settings,
)
from demo_core.memory.reserve import DeviceMemory, Span, context_span, device_memory
from demo_core.memory.step import StepShape, TrainingSettings
from demo_core.models.sources import PRESETS, byte_tokenizer, max_positions

_MAX_SEARCH_BATCH = 1 << 16  # the largest batch size a fit is searched up to

# ---- the step: a batch of one size, or the worst batch of a dataset's length profile -----------------------------

@registered
@functools.lru_cache(maxsize=16)  # the page asks again for every change of a setting
def dataset_lengths(dataset: str, samples: int, seed: int) -> tuple[int, ...]:
    """Example lengths of a dataset in the byte-level tokens the presets train on (untruncated)."""
    return tuple(len(ids) for ids in data.load(dataset, byte_tokenizer(), samples, seed, max_length=1 << 30).examples)


def step_shape(batch_size: int, seq_length: int, packed: bool, lengths: Sequence[int] | None = None) -> StepShape:
    """`batch_size` examples of `seq_length` tokens, or from a length profile the batch that needs the most memory:
    consecutive batches of examples cut to `seq_length`, padded to their longest or packed into one row."""
    if lengths is None:
        return StepShape.packed_row([seq_length] * batch_size) if packed else StepShape(batch_size, seq_length)
    cut = [min(n, seq_length) for n in lengths]
    if len(cut) < batch_size:
        raise DemoInputError(f"the dataset profile has {len(cut)} examples, fewer than a batch of {batch_size}")
    batches = [cut[i:i + batch_size] for i in range(0, len(cut) - batch_size + 1, batch_size)]
    if packed:
        return StepShape.packed_row(max(batches, key=sum))
    return StepShape.padded(max(batches, key=lambda batch: (max(batch), sum(batch))))


# ---- per device -------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class DeviceEstimate(StepPeak):
    categories: dict[str, int]  # per device; `context` is the CUDA context + NCCL (not in the live moments)
    temporary_terms: dict[str, int]
    live_by_moment: dict[str, dict[str, int]]  # moment -> category -> bytes alive then (live tensors only)
    activation_terms: dict[str, int]
    params: int
    trainable_params: int
    notes: list[str]
    memory: DeviceMemory  # the three numbers: live peak, reserved, device used (with ranges)
    reliable: bool = True  # False: a fitted term failed its checks (the plan refuses it)

    @property
    def peak_by_moment(self) -> dict[str, int]:
        return {moment: sum(parts.values()) for moment, parts in self.live_by_moment.items()}

    @property
    def device_used_high_bytes(self) -> int:
        """What fits are decided on: the device's used memory plus the margin its measurements allow."""
        return self.memory.device_used.high


_SHARDED = {"zero1": ("optimizer",), "zero2": ("optimizer", "gradients"),
            "zero3": ("optimizer", "gradients", "weights"), "fsdp": ("optimizer", "gradients", "weights")}


def _blocks(sizes: list[int], total: int) -> list[tuple[int, int]]:
    """`total` bytes as the allocator gets them: tensors of `sizes` (one entry each), scaled down when a shard holds
    less than all of them; what the sizes leave over (buffers, DDP's bucket copy) as one more block."""
    if total <= 0 or not sizes or sum(sizes) <= 0:
        return []
    factor = min(1.0, total / sum(sizes))
    counts = collections.Counter(max(1, round(size * factor)) for size in sizes)
    rest = total - sum(size * count for size, count in counts.items())
    return list(counts.items()) + ([(rest, 1)] if rest > 0 else [])


def _device_memory(config: PretrainedConfig, settings: TrainingSettings, gpus: int, shard: str,
                   live: dict[str, int], context: Span, context_source: str) -> DeviceMemory:
    """Reserved and device-used memory around the live tensors at the peak (`live`, per category). The segments
    are emulated for the tensors a step keeps (weights, gradients, optimizer state: their sizes are exact); what
    the step allocates and frees (activations, temporaries) is in the measured cache slack."""
    allocated = sum(live.values())
    if settings.device_type != "cuda":  # no caching allocator, no context: the process holds its tensors
        flat = Span(allocated, allocated, allocated)
        return DeviceMemory(allocated, flat, flat, {}, {}, "none (CPU)")
    sizes = state_tensor_sizes(config, settings)
    blocks = [block for category in ("weights", "gradients", "optimizer")
              for block in _blocks(sizes[category], live.get(category, 0))]
    persistent = live.get("weights", 0) + live.get("optimizer", 0) + (
        live.get("gradients", 0) if settings.gradients_kept else 0)
    return device_memory(allocated, blocks, allocated - persistent, shard in ("zero3", "fsdp"), gpus, context,
                         context_source)


def per_device_estimate(config: PretrainedConfig, step: StepShape, settings: TrainingSettings, gpus: int = 1,
                        shard: str = "none", context: Span = Span(0, 0, 0),
                        context_source: str = "none") -> DeviceEstimate:
    """The burst's estimate (`estimate_memory_detail`), divided as the sharding divides it (one GPU: unchanged),
    with the reserve and device use around its peak (memory_reserve.py) for a CUDA `context`."""
    estimate = estimate_memory_detail(config, step, settings)
    categories, temporaries = dict(estimate.categories), dict(estimate.temporary_terms)
    for category in _SHARDED.get(shard, ()):
        categories[category] = math.ceil(categories[category] / gpus)
    if shard in _SHARDED:
        temporaries["optimizer_step"] = math.ceil(temporaries["optimizer_step"] / gpus)
    gathered = buckets = 0  # alive through forward and backward, on top of the categories
    if shard in ("zero3", "fsdp"):
        facts = param_facts(config)
        bytes_per_param = estimate.categories["weights"] / max(facts.params, 1)
        gathered = temporaries["gathered_weights"] = int(2 * facts.largest_layer_params * bytes_per_param)
    elif shard == "none" and gpus > 1:
        buckets = categories["gradients"]  # DDP's reducer: a flat copy of every gradient, alive the whole step
        categories["gradients"] += buckets
    categories["temporary"] = max(temporaries.values())
    live = live_by_moment(categories, temporaries, settings.gradients_kept)
    for moment, parts in live.items():
        parts.pop("context", None)  # not a tensor: the device's used memory adds it (memory_reserve.py)
        if moment != "optimizer_step":
            parts["weights"] += gathered
            parts["gradients"] = parts.get("gradients", 0) + buckets
    peak_moment = max(live, key=lambda moment: sum(live[moment].values()))
    memory = _device_memory(config, settings, gpus, shard, live[peak_moment], context, context_source)
    categories["context"] = memory.device_used.bytes - memory.reserved.bytes
    return DeviceEstimate(categories, temporaries, live, estimate.activation_terms, estimate.params,
                          estimate.trainable_params, list(estimate.notes), memory, estimate.reliable)


@registered
@functools.lru_cache(maxsize=1)
def measured_context_bytes() -> int | None:
    """This process's CUDA context, measured (NVML used - reserved), when CUDA is already initialised here; None
    otherwise. A plan never initialises CUDA itself (a server may not own a GPU); the CLI does on a GPU machine."""
    import torch

    from demo_core.memory.measure import device_memory_snapshot

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return device_memory_snapshot("cuda").get("context_bytes")


def context_for(request: PlanRequest) -> tuple[Span, str]:
    """The CUDA context a plan adds to the reserve: given, measured on this machine, or the typical published
    figure for the CUDA module loading (memory_reserve.CUDA_CONTEXT_BYTES)."""
    if request.device != "cuda":
        return Span(0, 0, 0), "none (CPU)"
    if request.context_gb is not None:
        given = int(request.context_gb * GIB)
        return Span(given, given, given), "given (--context-gb)"
    typical = context_span(request.cuda_module_loading)
    measured = measured_context_bytes()
    if measured is not None:  # a bare context; kernels a run loads later can add up to the typical top
        return Span(measured, measured, max(measured, typical.high)), "measured on this machine's GPU"
    return typical, f"typical for CUDA with {request.cuda_module_loading} module loading (published figures)"


# ---- the plan -----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Plan:
    request: PlanRequest  # resolved: every "auto" replaced by what was planned
    config_name: str
    attention: str
    step: StepShape
    device: DeviceEstimate
    fits: dict[int, bool]  # GPU size (GiB) -> device used + margin fits
    max_batch_size: int  # 0: not even one example fits
    max_seq_length: int  # 0: not even 2 tokens per example fit
    scaling: list[dict[str, int]]  # seq_length, padded_bytes, packed_bytes (device used per device)
    notes: list[str]
    model_head: str  # causal-lm, masked-lm, sequence-classification, ... (from the config's architectures)

    def to_dict(self) -> dict:
        device, memory = self.device, self.device.memory
        return {
            "model": self.request.model, "config": self.config_name, "model_head": self.model_head,
            "request": dataclasses.asdict(self.request),
            "attention": self.attention, "tokens": self.step.token_slots, "params": device.params,
            "trainable_params": device.trainable_params, "per_device": device.categories,
            "total_bytes": device.peak_bytes, "reserved_bytes": memory.reserved.bytes,
            "device_used_bytes": memory.device_used.bytes, "margin_bytes": memory.margin_bytes,
            "fit_basis": FIT_BASIS, "predicts": PREDICTS,
            "reserved_range_bytes": [memory.reserved.low, memory.reserved.high],
            "device_used_range_bytes": [memory.device_used.low, memory.device_used.high],
            "reserve_terms": memory.reserve_terms, "device_terms": memory.device_terms,
            "context_source": memory.context_source, "peak_moment": device.peak_moment,
            "peak_by_moment": device.peak_by_moment, "live_at_peak": device.live_by_moment[device.peak_moment],
            "activation_terms": device.activation_terms,
            "temporary_terms": device.temporary_terms, "fits": {str(gb): ok for gb, ok in self.fits.items()},
            "gpu_gb": self.request.gpu_gb, "max_batch_size": self.max_batch_size,
            "max_seq_length": self.max_seq_length, "scaling": self.scaling,
            "notes": self.notes,
        }


def largest_fitting(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest n in [low, high] with fits(n), for `fits` true up to some n and false after; 0 if none."""
    if not fits(low):
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


@dataclasses.dataclass(frozen=True)
class _Planning:
    """A validated request with what every estimate of it needs."""

    request: PlanRequest
    config: PretrainedConfig
    settings: TrainingSettings
    lengths: tuple[int, ...] | None  # the dataset's example lengths, if planned from a length profile
    context: Span
    context_source: str

    @classmethod
    def of(cls, request: PlanRequest) -> "_Planning":
        request = request.validated()
        config = load_config(request.model)
        request = dataclasses.replace(request, loss=resolved_loss(request, config))
        lengths = dataset_lengths(request.dataset, request.samples, request.seed) if request.dataset else None
        return cls(request, config, training_settings(request, config), lengths, *context_for(request))

    def estimate(self, batch_size: int, seq_length: int, packed: bool) -> DeviceEstimate:
        step = step_shape(batch_size, seq_length, packed, self.lengths)
        try:
            estimate = per_device_estimate(self.config, step, self.settings, self.request.gpus, self.request.shard,
                                           self.context, self.context_source)
        except DemoInputError:
            raise
        except (ValueError, KeyError, TypeError, RuntimeError) as error:  # an architecture the probe cannot run
            raise DemoInputError(f"cannot estimate memory for {self.config.model_type} models: {error}") from None
        if not estimate.reliable:
            raise DemoInputError(f"cannot estimate memory for {self.config.model_type} models reliably: "
                                 + "; ".join(estimate.notes))
        return estimate


def device_estimate(request: PlanRequest) -> DeviceEstimate:
    """The per-device estimate of the request alone, without the searches and the curve of `plan`."""
    planning = _Planning.of(request)
    request = planning.request
    return planning.estimate(request.batch_size, request.seq_length, request.packed)


def plan(request: PlanRequest) -> Plan:
    planning = _Planning.of(request)
    request, config, lengths = planning.request, planning.config, planning.lengths
    budget_bytes = request.gpu_gb * GIB

    def needs(batch_size: int, seq_length: int, packed: bool = request.packed) -> int:
        """What a fit is decided on: the device's used memory plus the margin (FIT_BASIS)."""
        return planning.estimate(batch_size, seq_length, packed).device_used_high_bytes

    def device_used(batch_size: int, seq_length: int, packed: bool) -> int:
        return planning.estimate(batch_size, seq_length, packed).memory.device_used.bytes

    device = planning.estimate(request.batch_size, request.seq_length, request.packed)
    positions = max_positions(config) or 131072
    batch_cap = min(_MAX_SEARCH_BATCH, len(lengths)) if lengths else _MAX_SEARCH_BATCH
    max_batch = largest_fitting(lambda b: needs(b, request.seq_length) <= budget_bytes, 1, batch_cap)
    max_seq = largest_fitting(lambda s: needs(request.batch_size, s) <= budget_bytes, 2, positions)
    scaling = [{"seq_length": s, "padded_bytes": device_used(request.batch_size, s, False),
                "packed_bytes": device_used(request.batch_size, s, True)} for s in _scaling_lengths(positions)]
    notes = list(device.notes)
    if max_seq == positions:
        notes.append(f"fits up to the model's {positions:,} positions at batch size {request.batch_size}")
    if lengths and request.model not in PRESETS:
        notes.append("dataset lengths are byte-level tokens (the presets' tokenizer); a BPE tokenizer makes "
                     "roughly 3-4x fewer tokens of English text")
    if request.device == "cuda":
        notes.append(f"CUDA context {device.memory.device_terms['cuda_context'] / GIB:.2f} GiB: "
                     f"{device.memory.context_source}" + ("" if request.context_gb is not None else
                                                          "; pass a measured one with --context-gb"))
    step = step_shape(request.batch_size, request.seq_length, request.packed, lengths)
    fits = {gb: device.device_used_high_bytes <= gb * GIB for gb in GPU_SIZES_GB}
    return Plan(request, config.model_type, planning.settings.attention, step, device, fits, max_batch, max_seq,
                scaling, notes, model_head(config).kind)


def _scaling_lengths(positions: int) -> list[int]:
    lengths, length = [], 256
    while length <= min(positions, 65536):
        lengths.append(length)
        length *= 2
    return lengths
