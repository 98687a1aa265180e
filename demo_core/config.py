"""RunConfig: everything one comparison needs, declared once (settings.py) and validated in one place.

`RunConfig.validated()` is the single gate for user input: the CLI, the app and the API all build a RunConfig and
call it, so every bad value gets the same message everywhere. Caps come from `Limits`, which the app reads from the
environment (a shared Space wants smaller caps than a workstation).
"""

from __future__ import annotations

import dataclasses
import os

from demo_core.collators import COLLATORS, collator_names
from demo_core.data.loading import BUILTIN_DATASETS
from demo_core.errors import DemoInputError
from demo_core.models.sources import PRESETS
from demo_core.precision import PRECISION_NAMES
from demo_core.settings import Declaration, Widget, checked_values, setting

ATTENTION_NAMES = ("auto", "varlen", "sdpa", "eager", "flash_attention_2")
OPTIMIZER_NAMES = ("adamw", "sgd")
DEVICE_NAMES = ("auto", "cpu", "cuda")
# Which tokens carry loss (rendering.py): auto is TRL's default for the data's layout.
LOSS_ON_NAMES = ("auto", "all", "completion", "assistant")
# Attention paths that compute each segment's causal pairs only (no score matrix over the row, no mask): what the
# work ideal counts, what the estimate's kernel formulas cover, which mask panel the batch picture marks as used.
PER_SEGMENT_ATTENTION = ("varlen", "flash_attention_2")
# Memory estimates (memory_estimate.py) and the planner (planner.py) answer for more than a run can train: resolved
# names only ("auto" is picked before estimating), plus settings estimated but never trained here: bitsandbytes'
# 8-bit AdamW, Adafactor, and pure bf16 (precision.py).
ESTIMATE_OPTIMIZER_NAMES = OPTIMIZER_NAMES + ("adamw_8bit", "adafactor")
ESTIMATE_ATTENTION_NAMES = tuple(name for name in ATTENTION_NAMES if name != "auto")
# peft's shorthand for every linear layer but the output layer; otherwise LoRA targets are module names.
LORA_ALL_LINEAR = "all-linear"
MAX_LORA_RANK = 1024
# Micro-batches per step: when accumulation split the batch it could not exceed the largest batch (256), nor here,
# so that one step stays a bounded amount of work (`Limits.max_batch_size` caps each micro-batch).
MAX_GRAD_ACCUM = 256


def env_number(name: str, default: float | None, whole: bool = False) -> float | None:
    """An operator's numeric setting from the environment: unset or empty gives `default`; anything but a positive
    number (a whole one where `whole`) is refused with the variable's name, so the server stops at start-up with one
    clear line instead of failing at the first request that reads it."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    kind = "a whole number" if whole else "a number"
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise DemoInputError(f"{name} must be {kind} above 0, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise DemoInputError(f"{name} must be {kind} above 0, got {raw!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Limits:
    """Upper bounds on what one run may ask for. Defaults suit a workstation; the app reads PACKING_LAB_MAX_*."""

    max_samples: int = 20_000
    max_steps: int = 1_000
    max_batch_size: int = 256
    max_length: int = 8_192
    max_upload_bytes: int = 50 * 1024 * 1024

    @classmethod
    def from_env(cls) -> "Limits":
        def read(name: str, default: int) -> int:
            return int(env_number(name, default, whole=True))

        return cls(
            max_samples=read("PACKING_LAB_MAX_SAMPLES", cls.max_samples),
            max_steps=read("PACKING_LAB_MAX_STEPS", cls.max_steps),
            max_batch_size=read("PACKING_LAB_MAX_BATCH_SIZE", cls.max_batch_size),
            max_length=read("PACKING_LAB_MAX_LENGTH", cls.max_length),
            max_upload_bytes=read("PACKING_LAB_MAX_UPLOAD_BYTES", cls.max_upload_bytes),
        )


def parse_collators(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Accepts "padded,flatten" or a list; keeps the order given, drops repeats."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(item.strip() for item in items if item and item.strip()))
    known = collator_names()
    if not names:
        raise DemoInputError(f"choose at least one collator from: {', '.join(known)}")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise DemoInputError(f"unknown collator {unknown[0]!r}; choose from: {', '.join(known)}")
    return names


def parse_lora_targets(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Accepts "q_proj,v_proj" or a list; "all-linear" stands alone. Whether the names match the model's linear
    layers is checked against the model (lora_burst.check_lora_targets)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(str(item).strip() for item in items if item and str(item).strip()))
    if not names:
        raise DemoInputError(f"give lora targets: module names such as q_proj,v_proj, or {LORA_ALL_LINEAR}")
    if LORA_ALL_LINEAR in names and len(names) > 1:
        raise DemoInputError(f"lora targets: {LORA_ALL_LINEAR} already means every linear layer but the output "
                             f"layer; give it alone or give module names")
    return names


# ---- settings a run and its memory plan share (memory/plan_request.py places them too) ---------------------------
ATTENTION = Declaration("auto", choices=ATTENTION_NAMES, shown="{} attention", speed=True,
                        help="auto: flash-attn 2 or varlen (our per-example kernel) where they work on the device; or "
                             "one path by name")
SEED = Declaration(0, minimum=0, help="seed of the data's sample and order (and of a run's initial weights)")
GRADIENT_CHECKPOINTING = Declaration(None, speed=True,
                                     help="keep only each layer's input and recompute the layer in backward: less "
                                          "memory, a slower step; auto: on for LoRA/QLoRA (as TRL's SFTTrainer), off "
                                          "for a full fine-tune")
LORA_RANK = Declaration(0, minimum=0, maximum=MAX_LORA_RANK, shown="LoRA rank {}", speed=True,
                        help="train LoRA adapters of this rank through peft instead of every weight; 0: a full "
                             "fine-tune")
LORA_TARGETS = Declaration((LORA_ALL_LINEAR,), shown="LoRA on {}", speed=True,
                           help="the modules LoRA adapts: module names (e.g. q_proj,v_proj) or all-linear (every "
                                "linear layer but the output layer)")
QLORA = Declaration(False, speed=True, help="LoRA on a 4-bit NF4 base (bitsandbytes; a run needs CUDA)")
# Hugging Face's batch semantics (batch_semantics.py): the per-device micro-batch, multiplied by accumulation and by
# the processes, as `per_device_train_batch_size` x `gradient_accumulation_steps` (x GPUs) in every HF trainer.
BATCH_SIZE = Declaration(8, minimum=1, maximum="max_batch_size", shown="batch {}",
                         help="examples per device in one forward and backward pass (bfd and trl-bfd: packed rows), "
                              "transformers' per_device_train_batch_size; accumulation and devices multiply it")
GRAD_ACCUM = Declaration(1, minimum=1, maximum=MAX_GRAD_ACCUM, shown="× {} accumulation",
                         help="micro-batches per optimizer step (gradient_accumulation_steps): a step trains batch "
                              "size × N examples per device, its loss normalised by the trained tokens of all N")


def resolved_checkpointing(requested: bool | None, lora_rank: int) -> bool:
    """auto (None): on for LoRA/QLoRA, as TRL's SFTTrainer turns it on, off for a full fine-tune."""
    return bool(lora_rank) if requested is None else requested


def _collator_checkboxes() -> tuple[tuple[str, str], ...]:
    """The page's collator boxes: (the registry's label, the name)."""
    return tuple((spec.label, name) for name, spec in COLLATORS.items())


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one comparison needs, each setting declared once (settings.py): the CLI, the page, the API and the
    provenance line are derived from these fields. `api` is the `/compare` and `/preview` positional order, a contract:
    0-10 below, 11 is the endpoints' `dataset_file` (serving/api_docs.py), and a new setting takes the next free one."""

    model: str = setting("tiny-llama", builtins=lambda: tuple(PRESETS), api=0, page=Widget(1), shown="`{}`", speed=True,
                         help="a preset (tiny-*: random weights, trains on a CPU), a hub id such as gpt2, or a local "
                              "folder")
    dataset: str = setting("flan-like", builtins=lambda: tuple(BUILTIN_DATASETS), api=1, page=Widget(2), shown="`{}`",
                           help="a built-in length profile, a hub dataset id, or a .json/.jsonl file")
    samples: int = setting(256, minimum=1, maximum="max_samples", api=2, page=Widget(3), shown="{} samples",
                           help="examples drawn from the dataset")
    collators: tuple[str, ...] = setting(("padded", "flatten"), builtins=collator_names, api=3, shown="{}",
                                         page=Widget(4, label="Collators to compare", choices=_collator_checkboxes),
                                         help="the collators to compare, each on the same examples in the same order")
    steps: int = setting(20, minimum=1, maximum="max_steps", api=4, page=Widget(5, label="Steps per collator"),
                         shown="{} steps", help="optimizer steps per collator (step 1 is a warm-up, left out of the "
                                                "timings)")
    batch_size: int = BATCH_SIZE.placed(api=5, page=Widget(6, label="Batch size per device"))
    attention: str = ATTENTION.placed(api=6, page=Widget(7, more=True))
    seed: int = SEED.placed(api=7, page=Widget(10, more=True))
    max_length: int = setting(1024, minimum=2, maximum="max_length", api=8, page=Widget(11, more=True),
                              help="longer examples are truncated to this many tokens")
    precision: str = setting("auto", choices=PRECISION_NAMES, api=9, page=Widget(8, more=True), shown="{}", speed=True,
                             help="auto: bf16 on a GPU that has it, else fp32; or one by name")
    optimizer: str = setting("adamw", choices=OPTIMIZER_NAMES, api=10, page=Widget(9, more=True), shown="{}", speed=True,
                             help="the optimizer every collator trains with")
    learning_rate: float = setting(1e-3, api=17, page=Widget(17, more=True, row="optimizer"),
                                   help="the optimizer's constant learning rate (LoRA adapters usually train at 1e-4 "
                                        "to 1e-3)")
    device: str = setting("auto", choices=DEVICE_NAMES, speed=True,
                          help="where to train: auto picks cuda when there is one")
    gradient_checkpointing: bool | None = GRADIENT_CHECKPOINTING.placed(api=16, page=Widget(16, more=True))
    threads: int | None = setting(None, speed=True, help="CPU threads for training (default 1 on a CPU: with more, every "
                                             "parallel operator waits for a thread the OS gave to other work, and a "
                                             "shared machine's speedups swing 2x; on a dedicated machine, its core "
                                             "count)")
    loss_on: str = setting("auto", choices=LOSS_ON_NAMES, api=12, page=Widget(12, label="Loss on", more=True),
                           shown="loss on {}",
                           help="which tokens carry loss: all; completion (prompt/completion data: the answer); "
                                "assistant (conversations: the assistant turns); auto: TRL's default for the data's "
                                "layout (completion for prompt/completion data, all otherwise)")
    grad_accum: int = GRAD_ACCUM.placed(api=13, page=Widget(13, kind="number", label="Gradient accumulation",
                                                            more=True))
    lora_rank: int = LORA_RANK.placed(
        api=14, page=Widget(14, kind="number", label="LoRA rank (0: full fine-tune)", more=True, row="lora"))
    lora_targets: tuple[str, ...] = LORA_TARGETS.placed(
        api=15, page=Widget(15, kind="text", label="LoRA targets", more=True, row="lora"))
    qlora: bool = QLORA.placed(api=18)
    fsdp: bool = setting(False, speed=True, help="under torchrun / accelerate launch: shard weights, gradients and optimizer state "
                                     "over the processes (FSDP2) instead of a full copy on each (DDP)")

    def validated(self, limits: Limits | None = None) -> "RunConfig":
        """Returns a normalised copy, or raises DemoInputError naming the first bad field: the declared numbers,
        ranges and choices first (settings.checked_values), then what a declaration does not say."""
        limits = limits or Limits()
        numbers = checked_values(self, limits)
        if not isinstance(self.model, str) or not self.model.strip():
            raise DemoInputError("choose a model: a preset name, a hub id or a local folder")
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise DemoInputError("choose a dataset: a built-in name, a .json/.jsonl file or a hub dataset id")
        threads = numbers["threads"]
        if threads is not None and not 1 <= threads <= (os.cpu_count() or 1):
            raise DemoInputError(f"threads must be between 1 and this machine's {os.cpu_count()} CPUs, got {threads}")
        if not numbers["learning_rate"] > 0:
            raise DemoInputError(f"learning rate must be positive, got {numbers['learning_rate']}")
        if self.qlora and not numbers["lora_rank"]:
            raise DemoInputError("QLoRA trains LoRA adapters on a 4-bit base: give a lora rank (e.g. 16)")
        return dataclasses.replace(self, model=self.model.strip(), dataset=self.dataset.strip(),
                                   collators=parse_collators(self.collators),
                                   lora_targets=parse_lora_targets(self.lora_targets), **numbers)

    def resolved(self, *, device: str, precision: str, attention: str, threads: int | None, loss_on: str
                 ) -> "RunConfig":
        """The run as it trains, every "auto" decided (engine.prepare decides them from the device, the model and
        the data): the one configuration the bursts, their trainers and their memory estimate read, as TRL's
        trainers read their `SFTConfig`."""
        return dataclasses.replace(self, device=device, precision=precision, attention=attention, threads=threads,
                                   loss_on=loss_on, gradient_checkpointing=resolved_checkpointing(
                                       self.gradient_checkpointing, self.lora_rank))

    @property
    def examples_per_step(self) -> int:
        """Examples (bfd: rows) one process trains per optimizer step: its micro-batch times the accumulation. Times
        the processes, the effective batch (batch_semantics.py)."""
        return self.batch_size * self.grad_accum

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["collators"] = list(self.collators)
        data["lora_targets"] = list(self.lora_targets)
        return data
