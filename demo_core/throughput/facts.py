"""What the step-time model needs to know about a model and a run: widths, weight counts by kind, and the settings.

Weight counts come from the model built on the meta device (`memory.parameters.param_facts`), so every architecture
the planner reads is counted the same way, the LM head included. Three kinds of layer work are told apart:
- dense matmuls (attention projections, dense MLPs, routers, Mamba's in/out projections, the LM head): every token
  multiplies every weight;
- routed experts (mixture of experts: transformers keeps them as 3-D tensors, one slice per expert): a token uses
  `experts_per_token` of `experts`, and each expert's GEMM sees only the tokens routed to it (grouped GEMMs over
  few tokens run below peak: step_time prices them at their own token count);
- sequence mixing: softmax attention in `attention_layers` (its cost from score pairs), and state-space / linear
  attention layers (`ssm_layers`, Mamba2's chunked scan), whose scan work grows with the tokens like a matmul's.
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
OPTIMIZER_CHOICES = ("adamw", "adamw_8bit", "adafactor", "sgd")
# How torch's AdamW walks the parameters: one fused kernel, a few multi-tensor kernels per operation, or a loop of
# per-tensor operations (transformers' adamw_torch_fused, adamw_torch, and the single-tensor fallback).
OPTIMIZER_IMPL_CHOICES = ("fused", "foreach", "single-tensor")
# Shardings whose every micro-batch gathers the weights and reduce-scatters the gradients (FSDP FULL_SHARD, ZeRO-3).
PER_MICRO_BATCH_SHARDING = ("zero3", "fsdp")
# Shardings that split the optimizer state over the GPUs (its step then updates 1/N of it on each).
OPTIMIZER_SHARDING = ("zero1", "zero2", "zero3", "fsdp")
# Names configs give the expert count and the experts each token uses (Mixtral, Granite MoE and Jamba: the first
# pair; Qwen2/3-MoE, OLMoE: num_experts; DeepSeek: n_routed_experts).
_EXPERT_COUNT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_EXPERTS_PER_TOKEN_FIELDS = ("num_experts_per_tok", "moe_topk", "num_selected_experts")
_EXPERT_WIDTH_FIELDS = ("moe_intermediate_size", "intermediate_size")
_SHARED_EXPERT_WIDTH_FIELDS = ("shared_expert_intermediate_size", "shared_intermediate_size")
# Mamba2's chunked scan (Dao & Gu 2024, "Transformers are SSMs", the SSD algorithm): per head of width P with state N,
# per token, a chunk of Q tokens costs 2Q(N + P) FLOPs inside the chunk (C·Bᵀ, then times X) and 4NP across chunks
# (the chunk's state, and the output read from it). Mamba1's selective scan: about 9 FLOPs per channel and state.
DEFAULT_SSM_CHUNK = 256
MAMBA1_FLOPS_PER_CHANNEL_STATE = 9


def _first_int(config: Any, names: tuple[str, ...]) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def layer_kinds(config: Any) -> tuple[int, int]:
    """(softmax-attention layers, state-space / linear-attention layers): hybrids name their layers in a list
    (`layer_types`, `layers_block_type`) or by the attention layers' indices (`attn_layer_indices`, Bamba); Mamba
    models have no attention; every other decoder attends in each layer."""
    layers = int(config.num_hidden_layers)
    kinds = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None)
    if isinstance(kinds, (list, tuple)) and len(kinds) == layers:
        # full / sliding attention attend; mamba, linear attention and convolutions mix without a score matrix
        attending = sum(1 for kind in kinds if "attention" in str(kind) and not str(kind).startswith("linear"))
        return attending, layers - attending
    indices = getattr(config, "attn_layer_indices", None)
    if isinstance(indices, (list, tuple)):
        return len(indices), layers - len(indices)
    if config.model_type in ("mamba", "mamba2"):
        return 0, layers
    return layers, 0


def _ssm_scan(config: Any) -> tuple[float, int]:
    """(forward FLOPs per token of one state-space layer's scan, its inner width in channels)."""
    heads = _first_int(config, ("mamba_n_heads", "mamba_num_heads", "linear_num_value_heads")) or (
        _first_int(config, ("num_heads",)) if config.model_type == "mamba2" else 0)
    state = _first_int(config, ("mamba_d_state", "ssm_state_size", "state_size", "linear_key_head_dim"))
    expand = _first_int(config, ("mamba_expand", "expand")) or 2
    inner = expand * int(config.hidden_size)
    if heads and state:
        width = _first_int(config, ("mamba_d_head", "mamba_head_dim", "linear_value_head_dim")) or inner // heads
        chunk = _first_int(config, ("mamba_chunk_size", "chunk_size")) or DEFAULT_SSM_CHUNK
        return heads * (2 * chunk * (state + width) + 4 * state * width), heads * width
    if state:
        return MAMBA1_FLOPS_PER_CHANNEL_STATE * inner * state, inner
    return 0.0, 0


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    layers: int
    attention_layers: int  # layers with softmax attention (all of a plain decoder's)
    ssm_layers: int  # state-space / linear-attention layers of a hybrid
    hidden: int
    ffn: int  # MLP width a token passes through in a layer (MoE: its experts' and the shared expert's)
    vocab: int
    attention_width: int  # query heads x head dimension
    heads: int
    params: int
    dense_matmul_weights: int  # weights every token multiplies, the LM head included
    expert_matmul_weights: int  # routed experts' weights, all experts of all layers
    experts: int  # routed experts per MoE layer (0: dense)
    experts_per_token: int
    quantizable_weights: int  # linear weights but the LM head (what QLoRA stores in 4 bits)
    lora_weights: int  # adapter parameters for the run's rank and targets (0: full fine-tune)
    lora_targets_per_layer: int
    parameter_tensors: int  # tensors the optimizer walks (a per-tensor loop launches kernels per tensor)
    ssm_flops_per_token: float  # forward FLOPs of one SSM layer's scan per token
    ssm_width: int  # an SSM layer's inner channels (its element-wise traffic)

    @property
    def active_matmul_weights(self) -> float:
        """Weights one token multiplies: the dense ones and its share of the experts."""
        if not self.experts:
            return float(self.dense_matmul_weights)
        return self.dense_matmul_weights + self.expert_matmul_weights * self.experts_per_token / self.experts

    @classmethod
    def of(cls, config: Any, lora_rank: int = 0, lora_targets: tuple[str, ...] = ("all-linear",)) -> "ModelFacts":
        facts = param_facts(config)
        layers = int(config.num_hidden_layers)
        shapes = lora_adapter_shapes(config, lora_rank, lora_targets) if lora_rank else []
        experts = _first_int(config, _EXPERT_COUNT_FIELDS)
        per_token = _first_int(config, _EXPERTS_PER_TOKEN_FIELDS) if experts > 1 else 0
        routed = sum(math.prod(shape) for shape in facts.tensor_shapes if len(shape) == 3 and shape[0] == experts) \
            if per_token else 0
        # experts kept as lists of linear layers (older or remote code): the linear layers named experts.N
        listed = sum(inputs * outputs for name, inputs, outputs, _ in facts.linear_layers
                     if ".experts." in name and "shared" not in name) if per_token else 0
        dense_ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) \
            or 4 * config.hidden_size
        ffn = dense_ffn if not per_token else (
            per_token * _first_int(config, _EXPERT_WIDTH_FIELDS) + _first_int(config, _SHARED_EXPERT_WIDTH_FIELDS))
        attention_layers, ssm_layers = layer_kinds(config)
        scan_flops, scan_width = _ssm_scan(config) if ssm_layers else (0.0, 0)
        return cls(layers=layers, attention_layers=attention_layers, ssm_layers=ssm_layers,
                   hidden=int(config.hidden_size), ffn=int(ffn), vocab=int(config.vocab_size),
                   attention_width=int(config.num_attention_heads) * head_dim(config),
                   heads=int(config.num_attention_heads), params=facts.params,
                   dense_matmul_weights=facts.matmul_weight_params - listed,
                   expert_matmul_weights=routed + listed, experts=experts if per_token else 0,
                   experts_per_token=per_token, quantizable_weights=facts.quantizable_params,
                   lora_weights=sum(math.prod(shape) for shape in shapes),
                   lora_targets_per_layer=len(shapes) // 2 // layers if shapes else 0,
                   parameter_tensors=len(facts.tensor_shapes), ssm_flops_per_token=scan_flops,
                   ssm_width=scan_width)


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
    optimizer_impl: str = "fused"

    def __post_init__(self):
        for name, value, allowed in (("shard", self.shard, SHARDING_NAMES), ("precision", self.precision,
                                     PRECISION_CHOICES), ("weights", self.weights, WEIGHTS_CHOICES),
                                     ("attention", self.attention, ATTENTION_CHOICES),
                                     ("optimizer", self.optimizer, OPTIMIZER_CHOICES),
                                     ("optimizer impl", self.optimizer_impl, OPTIMIZER_IMPL_CHOICES)):
            if value not in allowed:
                raise DemoInputError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        for name in ("batch_size", "gpus", "grad_accum", "max_length"):
            if int(getattr(self, name)) < 1:
                raise DemoInputError(f"{name.replace('_', ' ')} must be at least 1, got {getattr(self, name)}")
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
