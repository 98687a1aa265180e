"""What a memory estimate is asked about: the batch of one step (`StepShape`) and how the step trains
(`TrainingSettings`, made from a validated plan request in one place: memory/plan_request.py `training_settings`)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from demo_core.config import ESTIMATE_ATTENTION_NAMES, ESTIMATE_OPTIMIZER_NAMES
from demo_core.precision import ESTIMATE_PRECISION_NAMES, PRECISIONS

_FP32_BYTES = 4
ADAPTER_DTYPE_NAMES = ("fp32", "base")


OPTIMIZER_IMPL_NAMES = ("fused", "foreach", "single-tensor")


LOSS_NAMES = ("model", "trl-fused")


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The batch of one optimizer step.

    Padded: `batch_size` rows of `seq_len` slots, `real_tokens` of them real (None: all), `segment_lengths` the rows'
    real lengths when known (the varlen kernel buckets by them). Packed: one row holding the examples back to back,
    `segment_lengths` their lengths, positions restarting at each; `seq_len` is the row's length.
    """

    batch_size: int
    seq_len: int
    real_tokens: int | None = None
    packed: bool = False
    segment_lengths: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.batch_size < 1 or self.seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be at least 1, got {self.batch_size} x {self.seq_len}")

    @classmethod
    def padded(cls, lengths: Sequence[int]) -> "StepShape":
        """Examples padded to the longest one."""
        return cls(len(lengths), max(lengths), sum(lengths), segment_lengths=tuple(lengths))

    @classmethod
    def packed_row(cls, lengths: Sequence[int]) -> "StepShape":
        """Examples in one padding-free row, positions restarting per example."""
        return cls(1, sum(lengths), sum(lengths), packed=True, segment_lengths=tuple(lengths))

    @property
    def rows(self) -> int:
        return 1 if self.packed else self.batch_size

    @property
    def token_slots(self) -> int:
        """Positions the model computes on: every slot of a padded batch, the packed row's tokens."""
        return self.seq_len if self.packed else self.batch_size * self.seq_len

    @property
    def has_padding(self) -> bool:
        return not self.packed and self.real_tokens is not None and self.real_tokens < self.token_slots

    def attention_segments(self) -> list[int]:
        """What attention attends within: the packed examples, or each row's real tokens."""
        if self.segment_lengths:
            return [int(n) for n in self.segment_lengths if n > 0]
        if self.packed:
            return [self.seq_len]
        real = self.real_tokens if self.real_tokens is not None else self.token_slots
        return [real // self.batch_size] * self.batch_size  # rows' lengths unknown: even split


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """How the step trains. Names as in config.py's ESTIMATE_* lists; checked where users type them (RunConfig,
    the planner), so a bad value here is a programming error."""

    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast, fp32 weights) | pure-bf16
    optimizer: str = "adamw"  # adamw | sgd (momentum) | adamw_8bit | adafactor
    attention: str = "sdpa"  # sdpa | eager | varlen | flash_attention_2
    gradient_checkpointing: bool = False
    device_type: str = "cpu"  # cpu | cuda
    context_bytes: int | None = None  # measured CUDA context, if any
    lora_rank: int = 0  # 0: full fine-tune
    lora_targets: tuple[str, ...] = ("all-linear",)
    quantized_base: bool = False  # QLoRA: the frozen linear weights in 4-bit NF4
    loss: str = "model"  # "model": the model's own loss (Trainer); "trl-fused": TRL SFTTrainer's chunked LM head
    half_weights: bool = False  # bf16/fp16: parameters loaded in the half dtype, autocast over them (no fp32 copy)
    adapter_dtype: str = "fp32"  # LoRA adapters in fp32 (peft's default) or in the base weights' dtype
    optimizer_impl: str = "fused"  # fused (Trainer's adamw_torch_fused), foreach, single-tensor (a per-tensor loop)
    gradients_kept: bool = False  # gradients live through forward and backward (accumulation, set_to_none=False)

    def __post_init__(self):
        for name, allowed in (("precision", ESTIMATE_PRECISION_NAMES), ("optimizer", ESTIMATE_OPTIMIZER_NAMES),
                              ("attention", ESTIMATE_ATTENTION_NAMES), ("device_type", ("cpu", "cuda")),
                              ("loss", LOSS_NAMES), ("adapter_dtype", ADAPTER_DTYPE_NAMES),
                              ("optimizer_impl", OPTIMIZER_IMPL_NAMES)):
            _check_choice(name, getattr(self, name), allowed)
        if self.quantized_base and not self.lora_rank:
            raise ValueError("a quantized base trains through LoRA adapters: give lora_rank")
        if self.half_weights and not PRECISIONS[self.precision].autocast:
            raise ValueError("half_weights is autocast over half-precision weights: precision bf16 or fp16")

    @property
    def base_param_bytes(self) -> int:
        """Bytes per parameter of the loaded model: fp32 masters, or the half dtype (pure bf16, half_weights)."""
        return 2 if self.half_weights else PRECISIONS[self.precision].weight_bytes

    @property
    def adapter_param_bytes(self) -> int:
        return _FP32_BYTES if self.adapter_dtype == "fp32" else self.base_param_bytes


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
