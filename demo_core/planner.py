"""Will this fine-tune fit? Memory per device for real model sizes, answered without training.

Every number comes from memory_estimate.py, the code path that estimates each burst: a preset with a run's settings
gives that run's own estimate, byte for byte. The planner adds what a run here never does: configs of real models
(shipped in model_configs/, or any hub id, its config.json alone), LoRA / QLoRA, 8-bit AdamW, Adafactor and pure bf16,
N GPUs with ZeRO / FSDP sharding, and the largest batch size and sequence length that fit.

Sharding, per device. Data parallel: each device runs its own micro-batch of `batch_size`, so activations are never
divided.
    none (DDP)    every device holds everything; DDP's gradient buckets are a second copy of the gradients
                  (PyTorch's default gradient_as_bucket_view=False), alive the whole step
    zero1         optimizer state / N
    zero2         + gradients / N
    zero3, fsdp   + weights / N, and two decoder layers' full weights gathered during forward and backward
                  (the layer computing and the one prefetched)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Callable, Sequence

from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from . import data, hub
from .attention import model_class, resolve_attention  # the engine's own attention choice
from .config import ESTIMATE_ATTENTION_NAMES, ESTIMATE_OPTIMIZER_NAMES, ESTIMATE_PRECISION_NAMES, as_float, as_int
from .errors import DemoInputError
from .memory_estimate import (StepPeak, StepShape, TrainingSettings, estimate_memory_detail, live_by_moment,
                              param_facts)
from .models import PRESETS, byte_tokenizer, max_positions

GPU_SIZES_GB = (24, 40, 80, 141)  # RTX 4090 / L40S-class, A100 40GB, A100/H100 80GB, H200 (GiB, nominal)
SHARDING_NAMES = ("none", "zero1", "zero2", "zero3", "fsdp")
MODEL_CONFIG_DIR = Path(__file__).with_name("model_configs")
# A planner cannot measure the GPU it plans for. CUDA 12 with lazy module loading plus PyTorch's cuBLAS workspace is
# a few hundred MB per process; pass --context-gb with a measured value (a run's memory report has one).
DEFAULT_CUDA_CONTEXT_GB = 0.5
GIB = 2 ** 30  # bytes per GiB: GPU sizes and the context are given in GB, counted as GiB
_MAX_SEARCH_BATCH = 1 << 16


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What to plan. `seq_length` is the length of every example, or with `dataset` the truncation length."""

    model: str
    batch_size: int = 8
    seq_length: int = 2048
    dataset: str | None = None
    samples: int = 512
    packed: bool = False
    precision: str = "bf16"
    optimizer: str = "adamw"
    attention: str = "auto"
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    lora_targets: str = "all-linear"
    qlora: bool = False
    gpus: int = 1
    shard: str = "none"
    device: str = "cuda"
    gpu_gb: float = 80
    context_gb: float | None = None
    seed: int = 0

    def validated(self) -> "PlanRequest":
        """A normalised copy, or DemoInputError naming the first bad field (the CLI, page and API all call it)."""
        ints = {name: as_int(name.replace("_", " "), getattr(self, name))
                for name in ("batch_size", "seq_length", "samples", "lora_rank", "gpus", "seed")}
        for name, low in (("batch_size", 1), ("seq_length", 2), ("samples", 1), ("gpus", 1)):
            if ints[name] < low:
                raise DemoInputError(f"{name.replace('_', ' ')} must be at least {low}, got {ints[name]}")
        if ints["lora_rank"] < 0:
            raise DemoInputError(f"lora rank must be 0 (full fine-tune) or more, got {ints['lora_rank']}")
        for name, allowed in (("precision", ESTIMATE_PRECISION_NAMES), ("optimizer", ESTIMATE_OPTIMIZER_NAMES),
                              ("attention", ("auto",) + ESTIMATE_ATTENTION_NAMES), ("shard", SHARDING_NAMES),
                              ("device", ("cuda", "cpu"))):
            if getattr(self, name) not in allowed:
                raise DemoInputError(f"unknown {name} {getattr(self, name)!r}; choose from: {', '.join(allowed)}")
        if self.qlora and not ints["lora_rank"]:
            raise DemoInputError("QLoRA trains LoRA adapters on a 4-bit base: give a lora rank (e.g. 16)")
        if self.shard != "none" and ints["gpus"] == 1:
            raise DemoInputError(f"{self.shard} shards over several GPUs: give gpus of 2 or more")
        gpu_gb = as_float("gpu gb", self.gpu_gb)
        if gpu_gb <= 0:
            raise DemoInputError(f"gpu gb must be positive, got {self.gpu_gb}")
        context_gb = None if self.context_gb is None else as_float("context gb", self.context_gb)
        if context_gb is not None and context_gb < 0:
            raise DemoInputError(f"context gb must be 0 or more, got {self.context_gb}")
        targets = tuple(t.strip() for t in str(self.lora_targets).split(",") if t.strip()) or ("all-linear",)
        if not isinstance(self.model, str) or not self.model.strip():
            raise DemoInputError("choose a model: a preset, a shipped config, a hub id or a local folder")
        return dataclasses.replace(self, model=self.model.strip(), gpu_gb=gpu_gb, context_gb=context_gb,
                                   lora_targets=",".join(targets),
                                   dataset=(self.dataset or "").strip() or None, **ints)


# ---- models -------------------------------------------------------------------------------------------------------

def shipped_configs() -> dict[str, Path]:
    """Config files shipped for real models (see model_configs/README.md), by short name."""
    return {path.stem: path for path in sorted(MODEL_CONFIG_DIR.glob("*.json"))}


def _shipped_config(path: Path) -> PretrainedConfig:
    values = json.loads(path.read_text())
    return CONFIG_MAPPING[values["model_type"]].from_dict(values)


def load_config(model: str) -> PretrainedConfig:
    """A preset, a shipped config (short name or its hub id), a local folder, or any hub id: its config.json alone,
    from the local cache or fetched when the hub can be reached (hub.config_file), as the model-memory Space does."""
    if model in PRESETS:
        return PRESETS[model].config()
    shipped = shipped_configs()
    by_hub_id = {json.loads(path.read_text()).get("_name_or_path"): path for path in shipped.values()}
    if model in shipped or model in by_hub_id:
        return _shipped_config(shipped.get(model) or by_hub_id[model])
    known = f"not a preset ({', '.join(PRESETS)}), not a shipped config ({', '.join(shipped)})"
    folder = Path(model).expanduser()
    if not folder.is_dir() and not hub.is_hub_id(model):
        raise DemoInputError(f"cannot read a config for {model!r}: {known}, and not a folder or a hub id")
    try:
        path = folder if folder.is_dir() else Path(hub.config_file(model)).parent
        return AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except DemoInputError as error:  # no network and not cached, or the hub has no such model
        raise DemoInputError(f"cannot read a config for {model!r}: {known}, and {error}") from None
    except (OSError, ValueError) as error:
        raise DemoInputError(f"cannot read a config for {model!r}: {known}, and its config.json could not be read "
                             f"({type(error).__name__})") from None


def _attention(request: PlanRequest, config: PretrainedConfig) -> str:
    """auto: the engine's own choice on that device. flash_attention_2 is planned for a GPU that has flash-attn,
    so only the model's support is checked, not this machine's."""
    if request.attention == "flash_attention_2":
        if not getattr(model_class(type(config)), "_supports_flash_attn", False):
            raise DemoInputError(f"{config.model_type} has no flash_attention_2 support in transformers")
        return "flash_attention_2"
    return resolve_attention(request.attention, config, request.device)


def training_settings(request: PlanRequest, config: PretrainedConfig) -> TrainingSettings:
    context_gb = request.context_gb if request.context_gb is not None else (
        DEFAULT_CUDA_CONTEXT_GB if request.device == "cuda" else 0)
    return TrainingSettings(
        precision=request.precision, optimizer=request.optimizer, attention=_attention(request, config),
        gradient_checkpointing=request.gradient_checkpointing, device_type=request.device,
        context_bytes=int(float(context_gb) * GIB), lora_rank=request.lora_rank,
        lora_targets=tuple(request.lora_targets.split(",")), quantized_base=request.qlora)


# ---- the step: a batch of one size, or the worst batch of a dataset's length profile -----------------------------

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
    categories: dict[str, int]  # per device
    temporary_terms: dict[str, int]
    live_by_moment: dict[str, dict[str, int]]  # moment -> category -> bytes alive then
    activation_terms: dict[str, int]
    params: int
    trainable_params: int
    notes: list[str]

    @property
    def peak_by_moment(self) -> dict[str, int]:
        return {moment: sum(parts.values()) for moment, parts in self.live_by_moment.items()}


def per_device_estimate(config: PretrainedConfig, step: StepShape, settings: TrainingSettings, gpus: int = 1,
                        shard: str = "none") -> DeviceEstimate:
    """The burst's estimate (`estimate_memory_detail`), divided as the sharding divides it. One GPU: unchanged."""
    estimate = estimate_memory_detail(config, step, settings)
    categories, temporaries = dict(estimate.categories), dict(estimate.temporary_terms)
    sharded = {"zero1": ("optimizer",), "zero2": ("optimizer", "gradients"),
               "zero3": ("optimizer", "gradients", "weights"), "fsdp": ("optimizer", "gradients", "weights")}
    for category in sharded.get(shard, ()):
        categories[category] = math.ceil(categories[category] / gpus)
    if shard in sharded:
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
    live = live_by_moment(categories, temporaries)
    for moment, parts in live.items():
        if moment != "optimizer_step":
            parts["weights"] += gathered
            parts["gradients"] = parts.get("gradients", 0) + buckets
    return DeviceEstimate(categories, temporaries, live, estimate.activation_terms, estimate.params,
                          estimate.trainable_params, list(estimate.notes))


# ---- the plan -----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Plan:
    request: PlanRequest
    config_name: str
    attention: str
    step: StepShape
    device: DeviceEstimate
    fits: dict[int, bool]  # GPU size (GiB) -> the peak fits
    max_batch_size: int  # 0: not even one example fits
    max_seq_length: int  # 0: not even 2 tokens per example fit
    scaling: list[dict[str, int]]  # seq_length, padded_bytes, packed_bytes (peak per device)
    notes: list[str]

    def to_dict(self) -> dict:
        device = self.device
        return {
            "model": self.request.model, "config": self.config_name, "request": dataclasses.asdict(self.request),
            "attention": self.attention, "tokens": self.step.token_slots, "params": device.params,
            "trainable_params": device.trainable_params, "per_device": device.categories,
            "total_bytes": device.peak_bytes, "peak_moment": device.peak_moment,
            "peak_by_moment": device.peak_by_moment, "live_at_peak": device.live_by_moment[device.peak_moment],
            "activation_terms": device.activation_terms,
            "temporary_terms": device.temporary_terms, "fits": {str(gb): ok for gb, ok in self.fits.items()},
            "gpu_gb": self.request.gpu_gb, "max_batch_size": self.max_batch_size,
            "max_seq_length": self.max_seq_length, "scaling": self.scaling, "notes": self.notes,
        }


def largest_fit_words(document: dict) -> str:
    """The largest batch size and sequence length that fit the asked GPU size, in words (the page and the CLI),
    saying so, with what to change, when not even one example or two tokens fit."""
    request, gpu = document["request"], f"{document['gpu_gb']:g} GB"
    batch = (f"largest batch size {document['max_batch_size']} at {request['seq_length']:,} tokens"
             if document["max_batch_size"] else f"not one example of {request['seq_length']:,} tokens fits")
    length = (f"longest sequence {document['max_seq_length']:,} tokens at batch size {request['batch_size']}"
              if document["max_seq_length"] else f"no length fits at batch size {request['batch_size']}")
    stuck = not (document["max_batch_size"] and document["max_seq_length"])
    hint = " (LoRA, 8-bit AdamW, gradient checkpointing or sharding over more GPUs need less)" if stuck else ""
    return f"on {gpu}: {batch}; {length}{hint}"


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

    @classmethod
    def of(cls, request: PlanRequest) -> "_Planning":
        request = request.validated()
        config = load_config(request.model)
        lengths = dataset_lengths(request.dataset, request.samples, request.seed) if request.dataset else None
        return cls(request, config, training_settings(request, config), lengths)

    def estimate(self, batch_size: int, seq_length: int, packed: bool) -> DeviceEstimate:
        step = step_shape(batch_size, seq_length, packed, self.lengths)
        try:
            return per_device_estimate(self.config, step, self.settings, self.request.gpus, self.request.shard)
        except DemoInputError:
            raise
        except (ValueError, KeyError, TypeError, RuntimeError) as error:  # an architecture the probe cannot run
            raise DemoInputError(f"cannot estimate memory for {self.config.model_type} models: {error}") from None


def device_estimate(request: PlanRequest) -> DeviceEstimate:
    """The per-device estimate of the request alone, without the searches and the curve of `plan`."""
    planning = _Planning.of(request)
    request = planning.request
    return planning.estimate(request.batch_size, request.seq_length, request.packed)


def plan(request: PlanRequest) -> Plan:
    planning = _Planning.of(request)
    request, config, lengths = planning.request, planning.config, planning.lengths
    budget_bytes = request.gpu_gb * GIB

    def peak(batch_size: int, seq_length: int, packed: bool = request.packed) -> int:
        return planning.estimate(batch_size, seq_length, packed).peak_bytes

    device = planning.estimate(request.batch_size, request.seq_length, request.packed)
    positions = max_positions(config) or 131072
    batch_cap = min(_MAX_SEARCH_BATCH, len(lengths)) if lengths else _MAX_SEARCH_BATCH
    max_batch = largest_fitting(lambda b: peak(b, request.seq_length) <= budget_bytes, 1, batch_cap)
    max_seq = largest_fitting(lambda s: peak(request.batch_size, s) <= budget_bytes, 2, positions)
    scaling = [{"seq_length": s, "padded_bytes": peak(request.batch_size, s, False),
                "packed_bytes": peak(request.batch_size, s, True)} for s in _scaling_lengths(positions)]
    notes = list(device.notes)
    if max_seq == positions:
        notes.append(f"fits up to the model's {positions:,} positions at batch size {request.batch_size}")
    if lengths and request.model not in PRESETS:
        notes.append("dataset lengths are byte-level tokens (the presets' tokenizer); a BPE tokenizer makes "
                     "roughly 3-4x fewer tokens of English text")
    if request.device == "cuda" and request.context_gb is None:
        notes.append(f"CUDA context assumed {DEFAULT_CUDA_CONTEXT_GB} GiB; pass a measured one (--context-gb)")
    step = step_shape(request.batch_size, request.seq_length, request.packed, lengths)
    return Plan(request, config.model_type, planning.settings.attention, step, device,
                {gb: device.peak_bytes <= gb * GIB for gb in GPU_SIZES_GB}, max_batch, max_seq, scaling, notes)


def _scaling_lengths(positions: int) -> list[int]:
    lengths, length = [], 256
    while length <= min(positions, 65536):
        lengths.append(length)
        length *= 2
    return lengths
