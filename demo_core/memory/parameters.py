"""What a model holds between steps, exactly: its parameters counted on the meta device (`param_facts`), what trains
(every weight, or LoRA's adapters), and the bytes of weights, gradients and optimizer states per tensor, as the
estimate's `weights`, `gradients` and `optimizer` categories and the allocator emulation (memory/reserve.py) read them.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Sequence

import torch

from demo_core.caches import LRU
from demo_core.isolation import exclusive
from demo_core.memory.heads import decoder_layers, head_dim, model_class_for, model_head
from demo_core.memory.step import TrainingSettings
from demo_core.models import lora

_FP32_BYTES = 4
# QLoRA (Dettmers et al. 2023): NF4 weights (4 bits) with one absmax per 64 weights, itself quantized to 8 bits
# with one fp32 constant per 256 absmaxes ("double quantization": 8/64 + 32/(64*256) = 0.127 bits per weight).
QLORA_BYTES_PER_PARAM = (4 + 8 / 64 + 32 / (64 * 256)) / 8


# bitsandbytes' blockwise 8-bit optimizers: one fp32 absmax per 256 elements and state; tensors under 4096
# elements (its min_8bit_size) keep 32-bit states.
_ADAM8BIT_BLOCK = 256


_ADAM8BIT_MIN_SIZE = 4096


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The few config facts the formulas need (everything else the probe reads from the model's code)."""

    layers: int
    head_dim: int
    hidden_size: int
    output_width: int  # vocabulary of a language model, labels of a classifier, 2 for span start/end
    classifier: bool  # one output per sequence (the anatomy page's BERT), not per token
    causal_lm: bool  # the only head a chunked LM-head loss applies to


def model_shape(config: Any) -> ModelShape:
    head = model_head(config)
    return ModelShape(
        layers=int(config.num_hidden_layers),
        head_dim=head_dim(config),
        hidden_size=int(config.hidden_size),
        output_width=head.output_width(config),
        classifier=not head.per_token,
        causal_lm=head.kind == "causal-lm",
    )


@dataclasses.dataclass(frozen=True)
class ParamFacts:
    """Exact counts from the model built on the meta device (no memory, no weights downloaded)."""

    params: int  # unique parameter elements (tied weights once)
    tensor_shapes: tuple[tuple[int, ...], ...]  # per unique parameter tensor
    buffer_bytes: int  # registered buffers (rotary inv_freq, ...), fp32 as built
    matmul_weight_params: int  # elements of 2-D weights used in matmuls (autocast copies them to half precision)
    quantizable_params: int  # matmul weights but the output layer's (what QLoRA stores in 4 bits)
    linear_layers: tuple[tuple[str, int, int, bool], ...]  # (name, in, out, is the output layer) of every matmul
    largest_layer_params: int  # one decoder layer's parameters (what ZeRO-3/FSDP gathers at a time)


# One entry per model config, a few hundred KB at most (a 70B model's per-layer shapes); 64 configs cover the
# presets, the shipped configs and the hub ids a server is asked about, and bound what uploaded folders add.
_PARAM_FACTS_CACHE: LRU = LRU(max_entries=64)


def param_facts(config: Any) -> ParamFacts:
    """Exact parameter/buffer counts of the model this config builds on the meta device (cached per config)."""
    key = (type(config).__name__, config.to_json_string(use_diff=False))
    facts = _PARAM_FACTS_CACHE.get(key)
    if facts is None:
        # Built in the config's own dtype, which transformers makes the process's default dtype while it builds: the
        # build holds the process's torch state, so a run training meanwhile never creates a tensor in it.
        with exclusive(), torch.device("meta"):
            model = model_class_for(config).from_config(config)
        params = list(model.parameters())  # .parameters() yields a tied weight once
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        linear: dict[int, tuple[int, bool]] = {}  # id(weight) -> (elements, is the output layer)
        layers = []
        for name, module in model.named_modules():
            if lora.linear_in_out(module) is not None:  # nn.Linear, transformers' Conv1D (gpt2)
                linear[id(module.weight)] = (module.weight.numel(), module is output)
                layers.append((name, *lora.linear_in_out(module), module is output))
        # Autocast copies every 2-D weight a matmul uses: linear layers, and routers that are plain parameters (MoE
        # gates). An embedding's weight is looked up, never copied, unless a linear layer shares it (tied lm_head).
        looked_up = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - set(linear)
        facts = _PARAM_FACTS_CACHE[key] = ParamFacts(
            params=sum(p.numel() for p in params),
            tensor_shapes=tuple(tuple(p.shape) for p in params),
            buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
            matmul_weight_params=sum(p.numel() for p in params if p.dim() == 2 and id(p) not in looked_up),
            quantizable_params=sum(n for n, is_output in linear.values() if not is_output),
            linear_layers=tuple(layers),
            largest_layer_params=max(sum(p.numel() for p in layer.parameters()) for layer in
                                     decoder_layers(model, int(config.num_hidden_layers))),
        )
    return facts


def lora_adapter_shapes(config: Any, rank: int, targets: Sequence[str]) -> list[tuple[int, int]]:
    """Shapes of the LoRA A (rank x in) and B (out x rank) matrices peft adds to the targeted linear layers."""
    shapes = []
    for name, in_features, out_features, is_output in param_facts(config).linear_layers:
        if lora.is_lora_target(name, is_output, tuple(targets)):
            shapes += [(rank, in_features), (out_features, rank)]
    return shapes


@dataclasses.dataclass(frozen=True)
class Trainable:
    """What the optimizer updates: every parameter, or the LoRA adapters (fp32 by peft's default)."""

    params: int
    tensor_shapes: tuple[tuple[int, ...], ...]
    bytes_per_param: int


def trainable(config: Any, settings: TrainingSettings) -> Trainable:
    facts = param_facts(config)
    if not settings.lora_rank:
        return Trainable(facts.params, facts.tensor_shapes, settings.base_param_bytes)
    shapes = tuple(lora_adapter_shapes(config, settings.lora_rank, settings.lora_targets))
    return Trainable(sum(math.prod(s) for s in shapes), shapes, settings.adapter_param_bytes)


def weight_bytes(config: Any, settings: TrainingSettings) -> int:
    facts = param_facts(config)
    param_bytes = settings.base_param_bytes
    buffers = facts.buffer_bytes * param_bytes // _FP32_BYTES
    if not settings.lora_rank:
        return facts.params * param_bytes + buffers
    adapters = trainable(config, settings)
    if not settings.quantized_base:
        return facts.params * param_bytes + adapters.params * adapters.bytes_per_param + buffers
    # QLoRA keeps the rest of the frozen model (embeddings, norms, output layer) in the base dtype: the half dtype
    # as loaded, or fp32 after peft's prepare_model_for_kbit_training, which upcasts every non-4-bit parameter.
    quantized = facts.quantizable_params
    rest = (facts.params - quantized) * param_bytes
    return math.ceil(quantized * QLORA_BYTES_PER_PARAM) + rest + adapters.params * adapters.bytes_per_param + buffers


def state_tensor_sizes(config: Any, settings: TrainingSettings) -> dict[str, list[int]]:
    """Bytes of the tensors a step keeps, one entry per tensor, as the CUDA caching allocator is asked for them
    (memory_reserve.py rounds them into its segments): weights (QLoRA's 4-bit linear weights at their packed size),
    gradients and optimizer states."""
    facts = param_facts(config)
    base = settings.base_param_bytes
    quantized = collections.Counter((out_features, in_features) for _, in_features, out_features, is_output
                                    in facts.linear_layers if not is_output) if settings.quantized_base else {}
    weights = []
    for dims in facts.tensor_shapes:
        if quantized.get(dims):
            quantized[dims] -= 1
            weights.append(math.ceil(math.prod(dims) * QLORA_BYTES_PER_PARAM))
        else:
            weights.append(math.prod(dims) * base)
    train = trainable(config, settings)
    trained = [math.prod(dims) * train.bytes_per_param for dims in train.tensor_shapes]
    if settings.lora_rank:
        weights += trained
    states = {"adamw": 2, "sgd": 1}.get(settings.optimizer, 2)  # 8-bit and factored states: two per tensor too
    per_state = [size // (train.bytes_per_param if settings.optimizer in ("adamw_8bit", "adafactor") else 1)
                 for size in trained]
    return {"weights": weights, "gradients": trained, "optimizer": per_state * states}


def optimizer_state_bytes(optimizer: str, train: Trainable) -> int:
    if optimizer == "adamw":
        # exp_avg + exp_avg_sq in the parameter dtype, plus torch's per-parameter scalar `step` tensor (fp32; on the
        # host unless the optimizer is fused/capturable, but optimizer state all the same).
        return 2 * train.bytes_per_param * train.params + _FP32_BYTES * len(train.tensor_shapes)
    if optimizer == "sgd":
        return train.bytes_per_param * train.params  # momentum_buffer
    if optimizer == "adafactor":
        # transformers' Adafactor (beta1=None): row and column second moments for tensors of 2+ dims, the full
        # second moment for vectors, and the parameter's RMS, which it keeps as a 0-d fp32 tensor.
        total = 0
        for dims in train.tensor_shapes:
            if len(dims) >= 2:
                total += math.prod(dims[:-1]) + math.prod(dims[:-2] + dims[-1:])
            else:
                total += math.prod(dims)
        return total * train.bytes_per_param + _FP32_BYTES * len(train.tensor_shapes)
    total = 0  # adamw_8bit
    for dims in train.tensor_shapes:
        n = math.prod(dims)
        if n >= _ADAM8BIT_MIN_SIZE:
            total += 2 * n + 2 * _FP32_BYTES * math.ceil(n / _ADAM8BIT_BLOCK)
        else:
            total += 2 * _FP32_BYTES * n
    return total
