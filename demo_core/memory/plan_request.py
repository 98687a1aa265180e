"""The planner's question, declared once (settings.py): what to plan, and how its answer is estimated.

`PlanRequest` is what `plan`, the "Will it fit?" section and `/plan` take; the settings a run takes too (attention,
checkpointing, LoRA, the seed) are the same `Declaration`s as `RunConfig`'s (config.py), so a run and its plan
cannot mean two things by one name. `training_settings` turns a validated request into the estimator's settings: the
one place where `memory/estimate.py`'s `TrainingSettings` are made (a burst's estimate asks through a `PlanRequest`
too: training/memory_guard.py). Configs of real models ship in models/configs/ (`load_config`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from demo_core.attention.capability import resolve_attention  # the engine's own attention choice
from demo_core.config import (
    ATTENTION,
    ESTIMATE_OPTIMIZER_NAMES,
    GRADIENT_CHECKPOINTING,
    LORA_RANK,
    LORA_TARGETS,
    QLORA,
    SEED,
    RunConfig,
    parse_lora_targets,
    resolved_checkpointing,
)
from demo_core.data import loading as data
from demo_core.errors import DemoInputError
from demo_core.memory.heads import model_head
from demo_core.memory.parameters import model_shape
from demo_core.memory.reserve import CUDA_MODULE_LOADING_NAMES
from demo_core.memory.step import ADAPTER_DTYPE_NAMES, OPTIMIZER_IMPL_NAMES, TrainingSettings
from demo_core.models import hub
from demo_core.models.sources import PRESETS, trained_config
from demo_core.precision import ESTIMATE_PRECISION_NAMES
from demo_core.settings import Widget, checked_values, setting, shared_names

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
    attention: str = ATTENTION.placed()
    gradient_checkpointing: bool | None = GRADIENT_CHECKPOINTING.placed(api=9, page=Widget(10))
    lora_rank: int = LORA_RANK.placed(api=7, page=Widget(8, kind="number", label="LoRA rank (0: full)", row="lora"))
    lora_targets: tuple[str, ...] = LORA_TARGETS.placed()
    qlora: bool = QLORA.placed(api=8, page=Widget(9, label="QLoRA (4-bit base)", row="lora"))
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
    seed: int = SEED.placed()
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

    @classmethod
    def for_run(cls, run: RunConfig, loss: str) -> "PlanRequest":
        """A resolved run (RunConfig.resolved) asked as a plan: the settings both declare, as they are, and how the
        run loads its model (fp32 weights, autocast for bf16/fp16) with the loss its trainer computes (`loss`:
        full, or TRL's chunked LM head)."""
        shared = {name: getattr(run, name) for name in shared_names(type(run), cls)}
        return cls(model=run.model, precision=run.precision, optimizer=run.optimizer, device=run.device,
                   grad_accum=run.grad_accum, base_dtype="fp32", loss=loss, **shared)

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
        if not isinstance(self.model, str) or not self.model.strip():
            raise DemoInputError("choose a model: a preset, a shipped config, a hub id or a local folder")
        dataset = None if self.dataset in (None, EQUAL_LENGTHS) else self.dataset.strip() or None
        lora = numbers["lora_rank"] > 0
        numbers["gradient_checkpointing"] = resolved_checkpointing(numbers["gradient_checkpointing"], lora)
        base_dtype = self.base_dtype
        if base_dtype == "auto":
            base_dtype = "half" if lora and self.precision in ("bf16", "fp16") else "fp32"
        return dataclasses.replace(self, model=self.model.strip(), lora_targets=parse_lora_targets(self.lora_targets),
                                   dataset=dataset, base_dtype=base_dtype,
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
        # a multimodal checkpoint trains as its language model (models/sources.py trained_config): plan that one
        return trained_config(AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True))
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
        lora_rank=request.lora_rank, lora_targets=request.lora_targets,
        quantized_base=request.qlora, loss="trl-fused" if resolved_loss(request, config) == "chunked" else "model",
        half_weights=request.base_dtype == "half", adapter_dtype=request.adapter_dtype,
        optimizer_impl=request.optimizer_impl, gradients_kept=request.grad_accum > 1 or request.keep_gradients)


