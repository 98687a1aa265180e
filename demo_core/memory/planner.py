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
import json
import math
from pathlib import Path
from typing import Callable, Sequence

from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from demo_core.data import loading as data
from demo_core.models import hub
from demo_core.memory.probe import model_head
from demo_core.attention.varlen import resolve_attention  # the engine's own attention choice
from demo_core.config import ESTIMATE_ATTENTION_NAMES, ESTIMATE_OPTIMIZER_NAMES
from demo_core.precision import ESTIMATE_PRECISION_NAMES
from demo_core.errors import DemoInputError
from demo_core.memory.estimate import (ADAPTER_DTYPE_NAMES, OPTIMIZER_IMPL_NAMES, StepPeak, StepShape, TrainingSettings,
                              estimate_memory_detail, live_by_moment, model_shape, param_facts, state_tensor_sizes)
from demo_core.memory.reserve import CUDA_MODULE_LOADING_NAMES, DeviceMemory, Span, context_span, device_memory
from demo_core.models.sources import PRESETS, byte_tokenizer, max_positions
from demo_core.settings import Widget, checked_values, setting

GPU_SIZES_GB = (24, 40, 80, 141)  # RTX 4090 / L40S-class, A100 40GB, A100/H100 80GB, H200 (GiB, nominal)
SHARDING_NAMES = ("none", "zero1", "zero2", "zero3", "fsdp", "fsdp-no-shard")
BASE_DTYPE_NAMES = ("auto", "fp32", "half")
LOSS_NAMES = ("auto", "full", "chunked")
OPTIMIZER_IMPL_CHOICES = ("auto",) + OPTIMIZER_IMPL_NAMES
MODEL_CONFIG_DIR = Path(__file__).parents[1] / "models" / "configs"
GIB = 2 ** 30  # bytes per GiB: GPU sizes and the context are given in GB, counted as GiB
EQUAL_LENGTHS = "equal lengths"  # no length profile: every example `seq_length` tokens (the page's choice for it)
FIT_BASIS = "device_used_bytes"  # what "fits", max_batch_size and max_seq_length are decided on (+ margin_bytes)
PREDICTS = {"total_bytes": "torch.cuda.max_memory_allocated (live tensors at the peak)",
            "reserved_bytes": "torch.cuda.max_memory_reserved (the caching allocator's pool)",
            "device_used_bytes": "nvidia-smi's used memory of the process (reserved + CUDA context + NCCL)"}
_MAX_SEARCH_BATCH = 1 << 16


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What to plan, each setting declared once (settings.py: the CLI, the page and `/plan` derive from these fields).
    `seq_length` is the length of every example, or with `dataset` the truncation length. `api` is `/plan`'s
    positional order, a contract: a new setting takes the next free position."""

    model: str = setting(builtins=lambda: tuple(shipped_configs()), api=0, page=Widget(1),
                         help="a shipped config of a real model, a preset (tiny-llama, llama-1b, ...), or a hub id "
                              "whose config.json is in the local cache (the CLI also reads a folder)")
    batch_size: int = setting(8, minimum=1, api=1, page=Widget(2, label="Batch size per device", row="shape"),
                              help="examples per step and device")
    seq_length: int = setting(2048, minimum=2, api=2, page=Widget(3, label="Sequence length", row="shape"),
                              help="tokens per example; with a length profile, examples are cut to this length")
    dataset: str | None = setting(None, api=3, page=Widget(4, kind="dropdown", label="Lengths",
                                                           choices=lambda: (EQUAL_LENGTHS, *data.BUILTIN_DATASETS)),
                                  help="a length profile instead of equal lengths, flan-like or orcamath-like (the "
                                       "CLI also reads a .json/.jsonl file or a hub dataset id): the batch that needs "
                                       "the most memory is planned")
    samples: int = setting(512, minimum=1, help="examples drawn for the length profile")
    packed: bool = setting(False, api=4, page=Widget(5, label="Packed (padding-free)"),
                           help="padding-free: each batch in one row")
    precision: str = setting("bf16", choices=ESTIMATE_PRECISION_NAMES, api=5, page=Widget(6, row="training"),
                             help="bf16/fp16: autocast (Trainer's bf16=True) over the base dtype's weights; "
                                  "pure-bf16: bf16 weights, gradients and optimizer state")
    optimizer: str = setting("adamw", choices=ESTIMATE_OPTIMIZER_NAMES, api=6, page=Widget(7, row="training"),
                             help="the optimizer whose states are counted")
    attention: str = setting("auto", choices=("auto",) + ESTIMATE_ATTENTION_NAMES,
                             help="auto: the path a run would take on that device")
    gradient_checkpointing: bool | None = setting(None, api=9, page=Widget(10),
                                                  help="keep only each layer's input and recompute the layer in "
                                                       "backward; default: on for LoRA/QLoRA (TRL's SFTTrainer), "
                                                       "off for a full fine-tune")
    lora_rank: int = setting(0, minimum=0, api=7, page=Widget(8, label="LoRA rank (0: full)", row="lora"),
                             help="LoRA rank on the attention and MLP projections; 0: a full fine-tune")
    lora_targets: str = setting("all-linear", help="comma list of module names (q_proj,v_proj,...) or all-linear")
    qlora: bool = setting(False, api=8, page=Widget(9, label="QLoRA (4-bit base)", row="lora"),
                          help="the frozen base weights in 4-bit NF4 (needs a LoRA rank)")
    gpus: int = setting(1, minimum=1, api=10, page=Widget(11, label="GPUs", row="gpus"),
                        help="devices the run is spread over")
    shard: str = setting("none", choices=SHARDING_NAMES, api=11, page=Widget(12, label="Sharding", row="gpus"),
                         help="none: DDP (full copies); zero1, zero2, zero3/fsdp shard the optimizer state, + the "
                              "gradients, + the weights; fsdp-no-shard: FSDP's NO_SHARD (no DDP bucket copy)")
    device: str = setting("cuda", choices=("cuda", "cpu"), help="the device planned for")
    gpu_gb: float = setting(80, api=12, page=Widget(13, kind="dropdown", choices=GPU_SIZES_GB,
                                                    label="GPU size for the largest batch and length (GB)"),
                            help="the GPU size the largest batch size and sequence length are searched for")
    context_gb: float | None = setting(None, minimum=0, help="measured CUDA context per process; default: measured on "
                                                             "this machine's GPU, else the published typical figure "
                                                             "for cuda_module_loading")
    seed: int = setting(0, help="seed of the length profile's sample")
    base_dtype: str = setting("auto", choices=BASE_DTYPE_NAMES,
                              help="the loaded weights under bf16/fp16: fp32 masters or half (loaded in bf16/fp16); "
                                   "auto: half for LoRA/QLoRA, fp32 for a full fine-tune")
    adapter_dtype: str = setting("fp32", choices=ADAPTER_DTYPE_NAMES,
                                 help="LoRA adapters in fp32 (peft's default) or in the base weights' dtype")
    loss: str = setting("auto", choices=LOSS_NAMES,
                        help="full: the model's loss over full logits; chunked: an LM-head loss in chunks (TRL "
                             "SFTTrainer, Liger, torchtune); auto: chunked for LoRA/QLoRA on a causal LM")
    optimizer_impl: str = setting("auto", choices=OPTIMIZER_IMPL_CHOICES,
                                  help="AdamW's step: fused (auto: Trainer's adamw_torch_fused, no scratch), foreach "
                                       "(a copy of the states), single-tensor (a per-tensor loop)")
    grad_accum: int = setting(1, minimum=1, help="micro-batches per optimizer step (gradients live through the "
                                                 "later forwards)")
    keep_gradients: bool = setting(False, help="zero_grad(set_to_none=False), torch < 2.0: gradients live through "
                                               "every step")
    cuda_module_loading: str = setting("lazy", choices=CUDA_MODULE_LOADING_NAMES,
                                       help="the typical context when none is measured: lazy (CUDA >= 11.7, "
                                            "PyTorch's default) or eager (older CUDA, CUDA_MODULE_LOADING=EAGER)")

    def validated(self) -> "PlanRequest":
        """A normalised copy, or DemoInputError naming the first bad field (the CLI, page and API all call it): the
        declared numbers, ranges and choices first (settings.checked_values), then what a declaration does not say."""
        numbers = checked_values(self)
        if self.qlora and not numbers["lora_rank"]:
            raise DemoInputError("QLoRA trains LoRA adapters on a 4-bit base: give a lora rank (e.g. 16)")
        if self.base_dtype == "half" and self.precision not in ("bf16", "fp16"):
            raise DemoInputError(f"a half-precision base is trained under bf16 or fp16 autocast, not {self.precision} "
                                 f"(pure-bf16 already keeps every weight in bf16)")
        if self.shard != "none" and numbers["gpus"] == 1:
            raise DemoInputError(f"{self.shard} shards over several GPUs: give gpus of 2 or more")
        if numbers["gpu_gb"] <= 0:
            raise DemoInputError(f"gpu gb must be positive, got {self.gpu_gb}")
        targets = tuple(t.strip() for t in str(self.lora_targets).split(",") if t.strip()) or ("all-linear",)
        if not isinstance(self.model, str) or not self.model.strip():
            raise DemoInputError("choose a model: a preset, a shipped config, a hub id or a local folder")
        dataset = None if self.dataset in (None, EQUAL_LENGTHS) else self.dataset.strip() or None
        lora = numbers["lora_rank"] > 0
        checkpointing = lora if self.gradient_checkpointing is None else bool(self.gradient_checkpointing)
        base_dtype = self.base_dtype
        if base_dtype == "auto":
            base_dtype = "half" if lora and self.precision in ("bf16", "fp16") else "fp32"
        return dataclasses.replace(self, model=self.model.strip(), lora_targets=",".join(targets), dataset=dataset,
                                   gradient_checkpointing=checkpointing, base_dtype=base_dtype,
                                   optimizer_impl="fused" if self.optimizer_impl == "auto" else self.optimizer_impl,
                                   keep_gradients=bool(self.keep_gradients), **numbers)


# ---- models -------------------------------------------------------------------------------------------------------

def shipped_configs() -> dict[str, Path]:
    """Config files shipped for real models (see models/configs/README.md), by short name."""
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
    """auto: the engine's own choice on that device for a causal LM; SDPA for other heads (encoders attend both
    ways, and the engine's varlen is causal). flash_attention_2 is planned for a GPU that has flash-attn, so only
    the model's support is checked, not this machine's."""
    head = model_head(config)
    if request.attention == "flash_attention_2":
        if not getattr(head.auto_class._model_mapping[type(config)], "_supports_flash_attn", False):
            raise DemoInputError(f"{config.model_type} has no flash_attention_2 support in transformers")
        return "flash_attention_2"
    if request.attention == "auto" and head.kind != "causal-lm":
        return "sdpa"
    return resolve_attention(request.attention, config, request.device)


def resolved_loss(request: PlanRequest, config: PretrainedConfig) -> str:
    """auto: the chunked LM-head loss for LoRA/QLoRA on a causal LM (TRL's SFTTrainer), the full logits otherwise."""
    causal_lm = model_shape(config).causal_lm
    if request.loss == "chunked" and not causal_lm:
        raise DemoInputError(f"a chunked loss computes next-token log-probabilities: {config.model_type} is "
                             f"planned with a {type(config).__name__} head that has none; choose loss full")
    if request.loss == "auto":
        return "chunked" if request.lora_rank and causal_lm else "full"
    return request.loss


def training_settings(request: PlanRequest, config: PretrainedConfig) -> TrainingSettings:
    """The estimator's settings for a validated request. The context is not a tensor: the plan adds it to the
    device's used memory (memory_reserve.py), so every live figure here is what max_memory_allocated would count."""
    return TrainingSettings(
        precision=request.precision, optimizer=request.optimizer, attention=_attention(request, config),
        gradient_checkpointing=bool(request.gradient_checkpointing), device_type=request.device, context_bytes=0,
        lora_rank=request.lora_rank, lora_targets=tuple(request.lora_targets.split(",")),
        quantized_base=request.qlora, loss="trl-fused" if resolved_loss(request, config) == "chunked" else "model",
        half_weights=request.base_dtype == "half", adapter_dtype=request.adapter_dtype,
        optimizer_impl=request.optimizer_impl, gradients_kept=request.grad_accum > 1 or request.keep_gradients)


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
            "fit_words": fit_basis_words(device), "notes": self.notes,
        }


def fit_basis_words(device: DeviceEstimate) -> str:
    """Which number the fits were decided on and the margin kept, in words (the page and the CLI)."""
    memory = device.memory
    return (f"fits are decided on the device's used memory as nvidia-smi shows it, "
            f"{memory.device_used.bytes / GIB:,.2f} GiB, plus a margin of {memory.margin_bytes / GIB:,.2f} GiB "
            f"(the spread of published allocator and CUDA-context measurements)")


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
