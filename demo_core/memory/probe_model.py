"""The probe's tiny copy of a model: the same config class with its widths (head_dim, hidden size, intermediate
sizes, vocabulary) replaced by small values and two decoder layers per kind of layer, everything else as the real
model has it (head counts, rotary fraction, norms, biases, activation, MoE expert counts), built with what changes
what autograd saves (`ProbeSpec`: layout, precision, attention, checkpointing, LoRA, TRL's fused head).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from demo_core.isolation import exclusive
from demo_core.memory.heads import head_dim, model_class_for
from demo_core.models.lora import apply_lora
from demo_core.precision import PRECISIONS

# Config fields the probe shrinks when present as integers; every other field keeps its real value, so it is exact
# by construction (only slower when large).
_WIDTH_FIELDS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size",
                 "n_inner")


# Fields named like widths that are not (a sliding window equal to the hidden size stays a window).
_NOT_WIDTHS = ("hidden_size", "vocab_size", "sliding_window", "max_position_embeddings", "max_window_layers")
# Widths a config derives from its hidden size when it is built, only where the real config has them so derived:
# they follow the probe's hidden size (a Mamba-2 layer needs heads x head width = its inner width, expand x hidden;
# Zamba2's shared attention reads the hidden state beside the embeddings, twice the hidden size).
_DERIVED_WIDTHS = {
    "mamba_d_head": lambda c: (getattr(c, "mamba_d_ssm", None) or c.mamba_expand * c.hidden_size) // c.mamba_n_heads,
    "mamba_headdim": lambda c: c.mamba_expand * c.hidden_size // c.n_mamba_heads,
    "attention_hidden_size": lambda c: 2 * c.hidden_size,
}


_VOCAB_POINTS = (64, 96)  # probe vocabulary sizes: base and bumped


_WIDTH_POINTS = (24, 40)  # multiples of 8: a bf16 row of them is 16-byte aligned, as grouped GEMMs (MoE) require


_HIDDEN_POINTS = (40, 56)  # only when hidden size is not heads x head_dim (explicit head_dim)


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
    """Everything besides sizes that changes what autograd saves."""

    layout: str  # "packed": one row, positions restart per segment; "masked": rows with a padding mask; "rows": none
    single_row: bool  # batch of one row (a batch of several rows is fitted over 2 and 3 rows)
    precision: str  # fp32 | bf16 | fp16 (autocast over fp32 weights) | pure-bf16 (bf16 weights, no autocast)
    attention: str  # attn_implementation the probe runs: sdpa, eager or ATTENTION_KERNEL_EXCLUDED
    checkpointing: bool
    lora_rank: int = 0  # 0: every parameter trains
    lora_targets: tuple[str, ...] = ("all-linear",)
    fused_lm_head: bool = False  # TRL SFTTrainer's loss: log-probs from the LM head in chunks, no full logits
    half_weights: bool = False  # bf16/fp16 autocast over weights loaded in the half dtype (not fp32 masters)
    adapter_dtype: str = "fp32"  # LoRA adapters: "fp32" (peft's autocast_adapter_dtype) or "base" (the weights')
    cuda_autocast: bool = False  # autocast as CUDA runs it: its float32 ops (layer_norm, softmax, ...) upcast


def _rotary_fraction(config: Any) -> float:
    """The fraction of head_dim that rotary embeddings rotate (partial rotary in phi, stablelm, gpt-neox, glm)."""
    rope = getattr(config, "rope_parameters", None) or {}
    for value in (rope.get("partial_rotary_factor") if isinstance(rope, dict) else None,
                  getattr(config, "partial_rotary_factor", None), getattr(config, "rotary_pct", None)):
        if value:
            return float(value)
    return 1.0


def _probe_head_dims(config: Any) -> tuple[int, int]:
    """Two small head dims whose rotary part is a whole, even number of channels (rotate_half halves it)."""
    fraction = _rotary_fraction(config)
    for base in range(8, 129, 8):
        rotary = base * fraction
        if rotary == int(rotary) and int(rotary) % 2 == 0:
            return base, 2 * base
    raise ValueError(f"no small head_dim gives a whole rotary width for partial rotary factor {fraction}")


def hidden_is_tied(config: Any) -> bool:
    return config.hidden_size == config.num_attention_heads * head_dim(config)


def width_names(config: Any) -> tuple[str, ...]:
    names = ["head_dim"] + ([] if hidden_is_tied(config) else ["hidden_size"])
    names += [f for f in _WIDTH_FIELDS if isinstance(getattr(config, f, None), int)]
    return tuple(names + ["vocab_size"])


def real_width(config: Any, name: str) -> int:
    return head_dim(config) if name == "head_dim" else int(getattr(config, name))


def width_points(config: Any, names: tuple[str, ...]) -> list[dict[str, int]]:
    """Base point, one point per width bumped alone, and every width bumped (a check the fit must also meet)."""
    low_d, high_d = _probe_head_dims(config)
    choices = {"head_dim": (low_d, high_d), "hidden_size": _HIDDEN_POINTS, "vocab_size": _VOCAB_POINTS}
    choices.update({name: _WIDTH_POINTS for name in names if name not in choices})
    base = {name: choices[name][0] for name in names}
    points = [base] + [{**base, name: choices[name][1]} for name in names]
    return points + [{name: choices[name][1] for name in names}]


@dataclasses.dataclass(frozen=True)
class ProbeLayers:
    """Which real layers the probe model's layers copy, and how many real layers each stands for.

    Two probe layers per kind of layer (layer_types, no_rope_layers, ...: `lists`), so that what several layers share
    (rotary tables, masks) shows up as shared. Under LoRA the model's first layer differs from the rest: its input
    needs no gradient (the embeddings are frozen), so autograd saves nothing there until the first adapter, not even
    the shared tables. The first kind then gets three probe layers: the first layer, counted once, and two more that
    stand for the other layers of that kind and still show what they share.
    """

    lists: tuple[str, ...]  # per-layer config lists
    copies: tuple[int, ...]  # per probe layer: the real layer whose list entries it takes
    weights: tuple[float, ...]  # per probe layer: how many real layers it stands for
    kinds: tuple[int, ...]  # per probe layer: its kind

    @classmethod
    def of(cls, config: Any, lora: bool) -> "ProbeLayers":
        layers = int(config.num_hidden_layers)
        lists = tuple(name for name, value in config.to_dict().items()
                      if isinstance(value, (list, tuple)) and len(value) == layers and layers > 1)
        signatures = [tuple(str(getattr(config, name)[i]) for name in lists) for i in range(layers)]
        copies, weights, kinds = [], [], []
        for kind, signature in enumerate(dict.fromkeys(signatures)):
            count = signatures.count(signature)
            if kind == 0 and lora:
                share = [1.0, (count - 1) / 2, (count - 1) / 2]
            else:
                share = [count / 2, count / 2]
            copies += [signatures.index(signature)] * len(share)
            weights += share
            kinds += [kind] * len(share)
        return cls(lists, tuple(copies), tuple(weights), tuple(kinds))


def _probe_config(config: Any, widths: dict[str, int], layers: ProbeLayers) -> Any:
    small = copy.deepcopy(config)
    for name in layers.lists:
        values = getattr(config, name)
        setattr(small, name, [values[i] for i in layers.copies])
    small.num_hidden_layers = len(layers.copies)
    if hidden_is_tied(config):
        small.hidden_size = config.num_attention_heads * widths["head_dim"]
    if "head_dim" in config.to_dict():  # a stored field (some configs compute it in a read-only property)
        small.head_dim = widths["head_dim"]
    for name, value in widths.items():
        if name != "head_dim":
            setattr(small, name, value)
    # A config's __init__ may have resolved a width to the hidden size (OPT's word_embed_proj_dim): shrunk alone, the
    # hidden size would make the two differ and add layers (OPT's project_in/out) the real model does not have.
    for name, value in config.to_dict().items():
        if (name.endswith(("_dim", "_size")) and name not in widths and name not in _NOT_WIDTHS
                and value == config.hidden_size):
            setattr(small, name, small.hidden_size)
    for name, derive in _DERIVED_WIDTHS.items():
        if isinstance(getattr(config, name, None), int) and getattr(config, name) == derive(config):
            setattr(small, name, derive(small))
    if "layers_block_type" in layers.lists and isinstance(getattr(config, "hybrid_layer_ids", None), list):
        # Zamba2 derives where its shared attention blocks sit from the layer kinds: follow the probe's layers
        small.hybrid_layer_ids = [i for i, kind in enumerate(small.layers_block_type) if kind == "hybrid"]
    # Special token ids of a real vocabulary would point outside the small one (padding_idx, ...).
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id"):
        if isinstance(getattr(small, name, None), int):
            setattr(small, name, 0)
        elif isinstance(getattr(small, name, None), list):
            setattr(small, name, [0])
    small.use_cache = False
    return small


def build_probe_model(config: Any, widths: dict[str, int], spec: ProbeSpec,
                       layers: ProbeLayers) -> torch.nn.Module:
    small = _probe_config(config, widths, layers)
    # a half base (LoRA over weights loaded in bf16/fp16) stores 2 bytes a weight like pure bf16
    dtype = torch.bfloat16 if spec.half_weights else PRECISIONS[spec.precision].weight_dtype
    with exclusive(seed=0):  # the same weights at every call, and no one else's random stream or dtype moved
        model = model_class_for(config).from_config(small, attn_implementation=spec.attention, dtype=dtype)
    model.train()
    if spec.fused_lm_head:
        from trl.trainer.utils import add_fused_lm_head  # TRL patches the model's forward; before LoRA, as it says

        add_fused_lm_head(model)
    if spec.lora_rank:
        apply_lora(model, spec.lora_rank, spec.lora_targets, dtype if spec.adapter_dtype == "base" else torch.float32)
    if spec.checkpointing:
        model.activation_checkpointing_enable()  # Trainer's default: non-reentrant; the layer inputs are saved
    return model
