"""What the step-time model needs to know about a model and a run: widths and weight counts, and the settings.

Weight counts come from the model built on the meta device (`memory_estimate.param_facts`), so every architecture
the planner reads is counted the same way, the LM head included. Mixture-of-experts layers are not told apart: their
experts count as if every token used all of them (the model leaves MoE out, docs/THROUGHPUT.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from demo_core.config import PER_SEGMENT_ATTENTION
from demo_core.errors import DemoInputError
from demo_core.memory.heads import head_dim
from demo_core.memory.parameters import lora_adapter_shapes, param_facts
from demo_core.memory.plan_request import SHARDING_NAMES

ATTENTION_CHOICES = ("flash_attention_2", "varlen", "sdpa", "eager")
PRECISION_CHOICES = ("bf16", "fp16", "tf32", "fp32")
WEIGHTS_CHOICES = ("auto", "fp32", "half")  # the planner's base dtypes: fp32 master weights, or pure half
OPTIMIZER_CHOICES = ("adamw", "sgd")
# Shardings whose every micro-batch gathers the weights and reduce-scatters the gradients (FSDP FULL_SHARD, ZeRO-3).
PER_MICRO_BATCH_SHARDING = ("zero3", "fsdp")
# Shardings that split the optimizer state over the GPUs (its step then updates 1/N of it on each).
OPTIMIZER_SHARDING = ("zero1", "zero2", "zero3", "fsdp")


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    layers: int
    hidden: int
    ffn: int
    vocab: int
    attention_width: int  # query heads x head dimension
    heads: int
    params: int
    matmul_weights: int  # every weight a matmul multiplies, the LM head included
    quantizable_weights: int  # matmul weights but the LM head (what QLoRA stores in 4 bits)
    lora_weights: int  # adapter parameters for the run's rank and targets (0: full fine-tune)
    lora_targets_per_layer: int

    @classmethod
    def of(cls, config: Any, lora_rank: int = 0, lora_targets: tuple[str, ...] = ("all-linear",)) -> "ModelFacts":
        facts = param_facts(config)
        layers = int(config.num_hidden_layers)
        shapes = lora_adapter_shapes(config, lora_rank, lora_targets) if lora_rank else []
        ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * config.hidden_size
        return cls(layers=layers, hidden=int(config.hidden_size), ffn=int(ffn), vocab=int(config.vocab_size),
                   attention_width=int(config.num_attention_heads) * head_dim(config),
                   heads=int(config.num_attention_heads), params=facts.params,
                   matmul_weights=facts.matmul_weight_params, quantizable_weights=facts.quantizable_params,
                   lora_weights=sum(math.prod(shape) for shape in shapes),
                   lora_targets_per_layer=len(shapes) // 2 // layers if shapes else 0)


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """One run as the step-time model sees it. `batch_size` is examples (packed rows: rows) per GPU per micro-batch
    (transformers' per_device_train_batch_size); `grad_accum` micro-batches make one optimizer step."""

    batch_size: int
    gpus: int = 1
    shard: str = "none"
    precision: str = "bf16"
    weights: str = "auto"  # auto: fp32 master weights under bf16/fp16 autocast (Trainer's bf16=True)
    attention: str = "flash_attention_2"
    lora_rank: int = 0
    qlora: bool = False
    gradient_checkpointing: bool = False
    grad_accum: int = 1
    max_length: int = 4096
    optimizer: str = "adamw"

    def __post_init__(self):
        for name, value, allowed in (("shard", self.shard, SHARDING_NAMES), ("precision", self.precision,
                                     PRECISION_CHOICES), ("weights", self.weights, WEIGHTS_CHOICES),
                                     ("attention", self.attention, ATTENTION_CHOICES),
                                     ("optimizer", self.optimizer, OPTIMIZER_CHOICES)):
            if value not in allowed:
                raise DemoInputError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        for name in ("batch_size", "gpus", "grad_accum", "max_length"):
            if int(getattr(self, name)) < 1:
                raise DemoInputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.qlora and not self.lora_rank:
            raise DemoInputError("QLoRA trains LoRA adapters on a 4-bit base: give a lora rank (e.g. 16)")
        if self.lora_rank < 0:
            raise DemoInputError(f"lora rank must be 0 (full fine-tune) or more, got {self.lora_rank}")

    @property
    def activation_bytes(self) -> int:
        return 4 if self.precision in ("fp32", "tf32") else 2

    @property
    def master_weight_bytes(self) -> int:
        """Bytes per weight the optimizer updates (and per gradient): fp32 unless the weights are pure half."""
        return 2 if self.weights == "half" and self.activation_bytes == 2 else 4

    @property
    def per_segment_attention(self) -> bool:
        return self.attention in PER_SEGMENT_ATTENTION

    @property
    def trains_base(self) -> bool:
        return not self.lora_rank
