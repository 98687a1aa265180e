"""RunConfig: everything one comparison needs, validated in one place.

`RunConfig.validated()` is the single gate for user input: the CLI, the app and the API all build a RunConfig and
call it, so every bad value gets the same message everywhere. Caps come from `Limits`, which the app reads from the
environment (a shared Space wants smaller caps than a workstation).
"""

from __future__ import annotations

import dataclasses
import os

from .collators import collator_names
from .errors import DemoInputError

ATTENTION_NAMES = ("auto", "varlen", "sdpa", "eager", "flash_attention_2")
PRECISION_NAMES = ("auto", "fp32", "bf16", "fp16")
OPTIMIZER_NAMES = ("adamw", "sgd")
DEVICE_NAMES = ("auto", "cpu", "cuda")
# Attention paths that compute each segment's causal pairs only (no score matrix over the row, no mask): what the
# work ideal counts, what the estimate's kernel formulas cover, which mask panel the batch picture marks as used.
PER_SEGMENT_ATTENTION = ("varlen", "flash_attention_2")
# Memory estimates (memory_estimate.py) and the planner (planner.py) answer for more than a run can train: resolved
# names only ("auto" is picked before estimating), plus settings estimated but never trained here: bitsandbytes'
# 8-bit AdamW, Adafactor, and pure bf16 (bf16 weights, gradients and optimizer state; no fp32 master copy).
ESTIMATE_PRECISION_NAMES = tuple(name for name in PRECISION_NAMES if name != "auto") + ("pure-bf16",)
ESTIMATE_OPTIMIZER_NAMES = OPTIMIZER_NAMES + ("adamw_8bit", "adafactor")
ESTIMATE_ATTENTION_NAMES = tuple(name for name in ATTENTION_NAMES if name != "auto")
# peft's shorthand for every linear layer but the output layer; otherwise LoRA targets are module names.
LORA_ALL_LINEAR = "all-linear"
MAX_LORA_RANK = 1024


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
            raw = os.environ.get(name)
            return int(raw) if raw else default

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


def as_int(name: str, value) -> int:
    """Integers from the CLI, the UI (floats from sliders) and the API (anything a client sends)."""
    if isinstance(value, bool):
        raise DemoInputError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise DemoInputError(f"{name} must be a whole number, got {value!r}")


def as_float(name: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DemoInputError(f"{name} must be a number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise DemoInputError(f"{name} must be a finite number, got {value!r}")
    return number


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: str = "tiny-llama"
    dataset: str = "flan-like"
    samples: int = 256
    collators: tuple[str, ...] = ("padded", "flatten")
    steps: int = 20
    batch_size: int = 8
    attention: str = "auto"
    seed: int = 0
    max_length: int = 1024
    precision: str = "auto"
    optimizer: str = "adamw"
    learning_rate: float = 1e-3
    device: str = "auto"
    gradient_checkpointing: bool = False
    threads: int | None = None  # CPU threads for training; None: 1 on a CPU (see engine.resolve_threads)
    lora_rank: int = 0  # 0: full fine-tune; else LoRA adapters of this rank through peft (lora_burst.py)
    lora_targets: tuple[str, ...] = (LORA_ALL_LINEAR,)  # peft's target_modules: module names, or "all-linear"
    qlora: bool = False  # LoRA on a 4-bit NF4 base (bitsandbytes, CUDA only)

    def validated(self, limits: Limits | None = None) -> "RunConfig":
        """Returns a normalised copy, or raises DemoInputError naming the first bad field."""
        limits = limits or Limits()
        samples = as_int("samples", self.samples)
        steps = as_int("steps", self.steps)
        batch_size = as_int("batch size", self.batch_size)
        seed = as_int("seed", self.seed)
        max_length = as_int("max length", self.max_length)
        learning_rate = as_float("learning rate", self.learning_rate)
        threads = None if self.threads is None else as_int("threads", self.threads)
        lora_rank = as_int("lora rank", self.lora_rank)
        if not isinstance(self.model, str) or not self.model.strip():
            raise DemoInputError("choose a model: a preset name, a hub id or a local folder")
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise DemoInputError("choose a dataset: a built-in name, a .json/.jsonl file or a hub dataset id")
        if not 1 <= samples <= limits.max_samples:
            raise DemoInputError(f"samples must be between 1 and {limits.max_samples}, got {samples}")
        if not 1 <= steps <= limits.max_steps:
            raise DemoInputError(f"steps must be between 1 and {limits.max_steps}, got {steps}")
        if not 1 <= batch_size <= limits.max_batch_size:
            raise DemoInputError(f"batch size must be between 1 and {limits.max_batch_size}, got {batch_size}")
        if not 2 <= max_length <= limits.max_length:
            raise DemoInputError(f"max length must be between 2 and {limits.max_length}, got {max_length}")
        if seed < 0:
            raise DemoInputError(f"seed must be 0 or more, got {seed}")
        if threads is not None and not 1 <= threads <= (os.cpu_count() or 1):
            raise DemoInputError(f"threads must be between 1 and this machine's {os.cpu_count()} CPUs, got {threads}")
        if not learning_rate > 0:
            raise DemoInputError(f"learning rate must be positive, got {learning_rate}")
        if not 0 <= lora_rank <= MAX_LORA_RANK:
            raise DemoInputError(f"lora rank must be between 0 (full fine-tune) and {MAX_LORA_RANK}, got {lora_rank}")
        if self.qlora and not lora_rank:
            raise DemoInputError("QLoRA trains LoRA adapters on a 4-bit base: give a lora rank (e.g. 16)")
        for field, allowed in (
            ("attention", ATTENTION_NAMES),
            ("precision", PRECISION_NAMES),
            ("optimizer", OPTIMIZER_NAMES),
            ("device", DEVICE_NAMES),
        ):
            if getattr(self, field) not in allowed:
                raise DemoInputError(f"unknown {field} {getattr(self, field)!r}; choose from: {', '.join(allowed)}")
        return dataclasses.replace(
            self,
            model=self.model.strip(),
            dataset=self.dataset.strip(),
            samples=samples,
            collators=parse_collators(self.collators),
            steps=steps,
            batch_size=batch_size,
            seed=seed,
            max_length=max_length,
            learning_rate=learning_rate,
            threads=threads,
            lora_rank=lora_rank,
            lora_targets=parse_lora_targets(self.lora_targets),
            qlora=bool(self.qlora),
        )

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["collators"] = list(self.collators)
        data["lora_targets"] = list(self.lora_targets)
        return data
