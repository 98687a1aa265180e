"""Saved-activation bytes of any transformers model at any size, fitted exactly from tiny copies of it run on the CPU.

What autograd keeps for backward depends on every line of a model's forward (q/k norms, post-norms, fused
projections, what the activation saves, a partial-rotary `cat` that forces a copy, what the loss upcasts). A formula
per architecture needs a list of model types and goes stale with the next one. Here the model's own code answers:

1. The same config class is built small: the widths (head_dim, hidden size, intermediate sizes, vocabulary) are
   replaced by small values, everything else keeps its real value (head counts, rotary fraction, norms, biases,
   activation, MoE expert counts), with two decoder layers per kind of layer (`layer_types`, `no_rope_layers`, ...).
2. It runs forwards at a few token shapes under `saved_tensors_hooks`, counting every storage once and parameters
   never, exactly as `SavedActivationMeter` does, split by where the save happened: per decoder layer (by part:
   norms, attention, MLP), once per model (embeddings, head and loss) or shared by several layers (rotary tables).
3. Every saved tensor holds (a token count) x (one width or 1): bytes are bilinear in a few token monomials
   (B*S, S, B, 1 and the quadratic B*S^2, S^2 of masks and scores; T, 1, T^2 for a packed row) and the widths.
   A least-squares fit over more points than unknowns recovers the coefficients; its residual says whether the
   architecture really is bilinear (it is for every dense decoder tried, to the byte) and is kept as a note.
4. The fit is evaluated at the real widths and token shape: L layers of each kind, plus the once-per-model parts.

Left to formulas in memory_estimate.py: autocast's half copies of weights (widths squared) and the kernel of
varlen / flash_attention_2 (its buffers follow the segment lengths, which a fit over token counts cannot see; the
probe runs the real varlen function with its kernel's saved tensors set aside). LoRA is emulated as peft computes
it (frozen base, base(x) + B(A(x)) * scale), so autograd itself leaves out what a frozen layer does not need.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import os
import threading
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (AttentionInterface, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
                          AutoModelForSequenceClassification, AutoModelForTokenClassification)
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
from transformers.models.auto import modeling_auto

from demo_core.isolation import exclusive
from demo_core.models.lora import apply_lora
from demo_core.memory.measure import storage_key
from demo_core.precision import PRECISIONS

# Config fields the probe shrinks when present as integers; every other field keeps its real value, so it is exact
# by construction (only slower when large).
_WIDTH_FIELDS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size",
                 "n_inner")
# Fields named like widths that are not (a sliding window equal to the hidden size stays a window).
_NOT_WIDTHS = ("hidden_size", "vocab_size", "sliding_window", "max_position_embeddings", "max_window_layers")
_VOCAB_POINTS = (64, 96)  # probe vocabulary sizes: base and bumped
_WIDTH_POINTS = (24, 40)  # multiples of 8: a bf16 row of them is 16-byte aligned, as grouped GEMMs (MoE) require
_HIDDEN_POINTS = (40, 56)  # only when hidden size is not heads x head_dim (explicit head_dim)
# Token shapes: odd sizes, away from the widths above (a weight copy is told apart by its values, see
# `_is_weight_copy`, so a token tensor of a weight's shape is counted all the same).
_ROWS_POINTS = (2, 3)
_SEQ_POINTS = (7, 11, 13)
_PACKED_POINTS = (17, 23, 29)
# A second set for a re-probe, and the held-out shape every fit must predict (rows, seq; packed: 1, T) before use.
_REPROBE_ROWS_POINTS = (2, 5)
_REPROBE_SEQ_POINTS = (9, 15, 19)
_REPROBE_PACKED_POINTS = (19, 31, 41)
_HELD_OUT = {"rows": (4, 17), "single_row": (1, 21), "packed": (1, 37)}
# A fit that misses the held-out forward by more than this is not bilinear for the architecture (float sums of
# exact byte counts agree to ~1e-9; a real misfit is whole tensors).
_HELD_OUT_TOLERANCE = 1e-6

ATTENTION_KERNEL_EXCLUDED = "packing_lab_probe_kernel"  # attention whose kernel the formulas count instead
# CUDA autocast runs these in float32, whatever their inputs ("CUDA Ops that can autocast to float32", PyTorch's
# Automatic Mixed Precision docs); CPU autocast runs most of them in the inputs' dtype. A LayerNorm or an eager
# softmax under CUDA autocast saves fp32 tensors a CPU run saves in bf16: the probe applies CUDA's list itself.
_CUDA_AUTOCAST_FP32_OPS = frozenset((
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits", "cosh",
    "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv",
    "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log", "log_softmax",
    "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss", "multi_margin_loss",
    "nll_loss", "norm", "normalize", "pdist", "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh",
    "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin", "softplus", "sum", "renorm", "tan",
    "triplet_margin_loss"))
_probe_state = threading.local()


def _kernel_stand_in(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Stands in for the varlen / flash_attention_2 kernel: what it saves is set aside (the formulas count it); what
    it returns has their layout, a fresh contiguous (batch, seq, heads, head_dim) tensor that o_proj then saves."""
    _probe_state.in_kernel = True
    _probe_state.kernel_heads = (query.shape[1], key.shape[1])  # as the model's code shapes them
    if query.requires_grad or key.requires_grad or value.requires_grad:  # else autograd saves nothing (LoRA's layer 0)
        _probe_state.kernel_saving_layers.add(getattr(_probe_state, "layer", None))
    try:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=getattr(module, "is_causal", True),
                                             scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
        # a copy even when SDPA's layout makes the transpose contiguous: the varlen kernels return a new tensor
        return out.transpose(1, 2).clone(memory_format=torch.contiguous_format), None
    finally:
        _probe_state.in_kernel = False


class _CudaAutocastFloat32Ops(torch.overrides.TorchFunctionMode):
    """Inside CPU autocast, runs CUDA autocast's float32 ops in float32 (their half inputs upcast, as CUDA does)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in _CUDA_AUTOCAST_FP32_OPS and torch.is_autocast_enabled("cpu"):
            def upcast(value):
                if isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.float16):
                    return value.float()
                return value

            args = tuple(upcast(value) for value in args)
            kwargs = {name: upcast(value) for name, value in kwargs.items()}
            with torch.autocast("cpu", enabled=False):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


AttentionInterface.register(ATTENTION_KERNEL_EXCLUDED, _kernel_stand_in)
AttentionMaskInterface.register(ATTENTION_KERNEL_EXCLUDED, flash_attention_mask)


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


@dataclasses.dataclass(frozen=True)
class ActivationFit:
    """Fitted bytes as coefficients over (token monomials) x (1, widths); `evaluate` applies them."""

    targets: tuple[str, ...]
    coefficients: np.ndarray  # (basis size, targets)
    quadratic_columns: np.ndarray  # bool per basis column: its token monomial is quadratic in tokens
    width_names: tuple[str, ...]
    spec: ProbeSpec
    residual_bytes: float  # largest misfit over the probe points: 0 when the architecture is bilinear
    kernel_heads: tuple[int, int] | None  # (query heads, key/value heads) the excluded kernel received
    kernel_layers: int  # real layers whose excluded kernel saves for backward (its inputs need a gradient)
    held_out_misfit_bytes: float  # largest miss on a forward the fit never saw (the reliability check)
    reference: "ProbeReference"  # that forward's shape and bytes: the physical bound of every term

    @property
    def reliable(self) -> bool:
        return self.held_out_misfit_bytes <= _HELD_OUT_TOLERANCE * max(self.reference.largest_bytes, 1.0) + 8

    def evaluate(self, config: Any, rows: int, seq_len: int) -> tuple[dict[str, int], dict[str, int]]:
        """(linear part, quadratic part) per target for `rows` x `seq_len` tokens of the real-width model."""
        widths = [_real_width(config, name) for name in self.width_names]
        basis = _basis(_token_monomials(self.spec, rows, seq_len), widths)
        contributions = basis[:, None] * self.coefficients
        linear = contributions[~self.quadratic_columns].sum(axis=0)
        quadratic = contributions[self.quadratic_columns].sum(axis=0)
        return ({t: int(round(v)) for t, v in zip(self.targets, linear)},
                {t: int(round(v)) for t, v in zip(self.targets, quadratic)})


@dataclasses.dataclass(frozen=True)
class ProbeReference:
    """The held-out forward of a fit: its token monomials, widths and measured bytes per target.

    Every saved tensor holds (a token monomial) x (a width or 1) bytes, a count that is never negative, so at any
    size a target's bytes are at most its bytes here times the largest growth of a monomial times the largest
    growth of a width (`bound`): a fitted value beyond that, or below zero, is a fit gone wrong, not memory.
    """

    monomials: tuple[float, ...]
    widths: tuple[int, ...]
    bytes_by_target: dict[str, float]

    @property
    def largest_bytes(self) -> float:
        return max(self.bytes_by_target.values(), default=0.0)

    def bound(self, target: str, monomials: list[float], widths: list[int],
              among: list[bool] | None = None) -> float:
        """The bound at `monomials` (the real token shape's, in `_token_monomials` order); `among`: which of them
        may grow it (a linear part's bound is not the quadratic monomials' growth)."""
        token_growth = max((real / ref for index, (real, ref) in enumerate(zip(monomials, self.monomials))
                            if among is None or among[index]), default=1.0)
        width_growth = max([1.0] + [real / ref for real, ref in zip(widths, self.widths)])
        return self.bytes_by_target.get(target, 0.0) * max(token_growth, 1.0) * width_growth


# ---- widths -----------------------------------------------------------------------------------------------------

def head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


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


def _hidden_is_tied(config: Any) -> bool:
    return config.hidden_size == config.num_attention_heads * head_dim(config)


def _width_names(config: Any) -> tuple[str, ...]:
    names = ["head_dim"] + ([] if _hidden_is_tied(config) else ["hidden_size"])
    names += [f for f in _WIDTH_FIELDS if isinstance(getattr(config, f, None), int)]
    return tuple(names + ["vocab_size"])


def _real_width(config: Any, name: str) -> int:
    return head_dim(config) if name == "head_dim" else int(getattr(config, name))


def _width_points(config: Any, names: tuple[str, ...]) -> list[dict[str, int]]:
    """Base point, one point per width bumped alone, and every width bumped (a check the fit must also meet)."""
    low_d, high_d = _probe_head_dims(config)
    choices = {"head_dim": (low_d, high_d), "hidden_size": _HIDDEN_POINTS, "vocab_size": _VOCAB_POINTS}
    choices.update({name: _WIDTH_POINTS for name in names if name not in choices})
    base = {name: choices[name][0] for name in names}
    points = [base] + [{**base, name: choices[name][1]} for name in names]
    return points + [{name: choices[name][1] for name in names}]


# ---- the small model --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _ProbeLayers:
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
    def of(cls, config: Any, lora: bool) -> "_ProbeLayers":
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


def _probe_config(config: Any, widths: dict[str, int], layers: _ProbeLayers) -> Any:
    small = copy.deepcopy(config)
    for name in layers.lists:
        values = getattr(config, name)
        setattr(small, name, [values[i] for i in layers.copies])
    small.num_hidden_layers = len(layers.copies)
    if _hidden_is_tied(config):
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
    # Special token ids of a real vocabulary would point outside the small one (padding_idx, ...).
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id"):
        if isinstance(getattr(small, name, None), int):
            setattr(small, name, 0)
        elif isinstance(getattr(small, name, None), list):
            setattr(small, name, [0])
    small.use_cache = False
    return small


@dataclasses.dataclass(frozen=True)
class ModelHead:
    """What sits on the model's last hidden state, as the config's `architectures` names it."""

    kind: str  # causal-lm | masked-lm | sequence-classification | token-classification | question-answering
    auto_class: type
    per_token: bool  # one output row per token (language models, token classification, spans) or per sequence

    def output_width(self, config: Any) -> int:
        if self.kind in ("causal-lm", "masked-lm"):
            return int(config.vocab_size)
        if self.kind == "question-answering":
            return 2  # start and end logits
        return int(getattr(config, "num_labels", 2))


# transformers' own Auto-class mappings decide which head an architecture name is (BertForSequenceClassification
# is a classifier with num_labels outputs, BertForMaskedLM a vocabulary head, LlamaForCausalLM a causal LM).
_HEADS = (
    (ModelHead("causal-lm", AutoModelForCausalLM, True), modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
    (ModelHead("masked-lm", AutoModelForMaskedLM, True), modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
    (ModelHead("sequence-classification", AutoModelForSequenceClassification, False),
     modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
    (ModelHead("token-classification", AutoModelForTokenClassification, True),
     modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES),
    (ModelHead("question-answering", AutoModelForQuestionAnswering, True),
     modeling_auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES),
)


def model_head(config: Any) -> ModelHead:
    """The head the config's `architectures` names; a causal LM when it names none this planner trains (presets,
    bare configs, base `...Model` checkpoints)."""
    for name in getattr(config, "architectures", None) or []:
        for head, mapping in _HEADS:
            if name in mapping.values():
                return head
    return _HEADS[0][0]


def model_class_for(config: Any) -> type:
    """The Auto class that builds the model with the head the config's architectures name."""
    return model_head(config).auto_class


def _build_probe_model(config: Any, widths: dict[str, int], spec: ProbeSpec,
                       layers: _ProbeLayers) -> torch.nn.Module:
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


def decoder_layers(model: torch.nn.Module, count: int) -> torch.nn.ModuleList:
    """The model's list of `count` decoder (or encoder) layers."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(f"{type(model).__name__} has no list of {count} layers to attribute saved tensors to")


# ---- one forward, attributed --------------------------------------------------------------------------------------

_PART_BY_CLASS_NAME = (("Norm", "norms"), ("Attention", "attention"), ("Attn", "attention"), ("MLP", "mlp"),
                       ("Mlp", "mlp"), ("FeedForward", "mlp"), ("Expert", "mlp"), ("Moe", "mlp"), ("MoE", "mlp"),
                       ("Intermediate", "mlp"))


def _part_of(stack: list[torch.nn.Module]) -> str:
    """The part of a layer a save happened in: the innermost module whose class name says norm, attention or MLP."""
    for module in reversed(stack):
        name = type(module).__name__
        for marker, part in _PART_BY_CLASS_NAME:
            if marker in name:
                return part
    return "layer_other"


def _dropout_scales(config: Any) -> set[float]:
    """1/(1-p) for every dropout probability in the config: the values of a CPU dropout mask (float, scaled)."""
    scales = set()
    for name, value in config.to_dict().items():
        if ("dropout" in name or name.endswith("pdrop")) and isinstance(value, float) and 0 < value < 1:
            scales.add(1.0 / (1.0 - value))
    return scales


class _SaveRecorder:
    """Saved-tensor hooks + module hooks: bytes per (where, part) for one forward of a probe model."""

    def __init__(self, model: torch.nn.Module, config: Any, layer_count: int, cuda_autocast: bool = False):
        self.cuda_autocast = cuda_autocast
        self.stack: list[torch.nn.Module] = []
        self.layer: int | None = None
        self.after_layers = False
        self.dropout_scales = _dropout_scales(config)
        layers = decoder_layers(model, layer_count)
        for index, layer in enumerate(layers):
            layer.register_forward_pre_hook(lambda *_, index=index: self._enter_layer(index))
            layer.register_forward_hook(lambda *_: self._leave_layer())
        # Hooks must return None: a value returned by a forward hook would replace the module's output.
        for module in model.modules():
            module.register_forward_pre_hook(self._enter_module)
            module.register_forward_hook(self._leave_module)
        self.param_keys = {storage_key(p)[:2] for p in model.parameters()}
        self.weights_by_shape: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for p in model.parameters():
            if p.dim() == 2:
                self.weights_by_shape.setdefault(tuple(p.shape), []).append(p.detach())
                self.weights_by_shape.setdefault(tuple(p.shape)[::-1], []).append(p.detach().t())

    def _enter_module(self, module: torch.nn.Module, *_: Any) -> None:
        self.stack.append(module)

    def _leave_module(self, *_: Any) -> None:
        self.stack.pop()

    def _enter_layer(self, index: int) -> None:
        self.layer = _probe_state.layer = index

    def _leave_layer(self) -> None:
        self.layer, self.after_layers = None, True
        _probe_state.layer = None

    def _is_weight_copy(self, t: torch.Tensor) -> bool:
        """Autocast's half copy of a weight (the formulas count those): a 2-D half tensor holding a weight's values.
        By value, not by shape: a token tensor can take a weight's shape (TRL's fused head saves the hidden states
        of B x (S-1) tokens as one 2-D tensor, 2 x 12 = 24 rows like a 24-wide layer), and counting it as a copy
        made the fit miss whole tensors."""
        if t.dim() != 2 or t.dtype == torch.float32:
            return False
        return any(torch.equal(t, weight.to(t.dtype)) for weight in self.weights_by_shape.get(tuple(t.shape), ()))

    def _is_dropout_mask(self, t: torch.Tensor) -> bool:
        if not self.dropout_scales or t.requires_grad or not t.is_floating_point():
            return False
        values = set(torch.unique(t.detach().float()).tolist()) - {0.0}
        return len(values) == 1 and any(abs(values.pop() - s) < 1e-3 * s for s in self.dropout_scales)

    def run(self, model: torch.nn.Module, batch: dict, autocast: bool) -> dict[tuple, int]:
        self.layer, self.after_layers, self.stack = None, False, []
        seen: dict[tuple, list] = {}  # storage key -> [bytes, first place, every place]
        kernel_keys: set[tuple] = set()
        keep: list[torch.Tensor] = []  # saved tensors stay alive until the count is done: no address reuse

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = storage_key(t)
            if key[:2] in self.param_keys or key in kernel_keys or (autocast and self._is_weight_copy(t)):
                return t
            if getattr(_probe_state, "in_kernel", False):
                kernel_keys.add(key)
                return t
            keep.append(t)
            mask = self._is_dropout_mask(t)
            if self.layer is not None:
                place = ("layer", self.layer, "dropout_masks" if mask else _part_of(self.stack))
            else:
                place = ("model", "dropout_masks" if mask else "head_and_loss" if self.after_layers else "embeddings")
            seen.setdefault(key, [key[2], place, set()])[2].add(place[:2])
            return t

        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
        policy = _CudaAutocastFloat32Ops() if autocast and self.cuda_autocast else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx, policy:
            model(**batch)
        totals: dict[tuple, int] = {}
        for nbytes, place, places in seen.values():
            if len(places) > 1:
                place = ("model", "shared_across_layers")  # rotary tables, masks, index tensors of the kernel
            totals[place] = totals.get(place, 0) + nbytes
        keep.clear()
        return totals


def _batch(config: Any, spec: ProbeSpec, rows: int, seq_len: int, vocab: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, seq_len), generator=generator)
    batch: dict[str, Any] = {"input_ids": ids}
    labels = ids.clone()
    if spec.layout == "packed":
        third = seq_len // 3
        lengths = [third, third, seq_len - 2 * third]
        batch["position_ids"] = torch.cat([torch.arange(n) for n in lengths])[None]
    elif spec.layout == "masked":
        lengths = torch.full((rows,), seq_len)
        lengths[1:] = seq_len // 2
        if rows == 1:
            lengths[0] = seq_len - 2
        mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
        batch["attention_mask"] = mask
        labels = labels.masked_fill(mask == 0, -100)
    head = model_head(config)
    if head.kind == "causal-lm":
        batch["use_cache"] = False
    elif head.kind == "sequence-classification":
        labels = torch.randint(0, head.output_width(config), (rows,), generator=generator)
    elif head.kind == "token-classification":
        labels = torch.randint(0, head.output_width(config), (rows, seq_len), generator=generator)
    elif head.kind == "question-answering":
        batch["start_positions"] = torch.randint(0, seq_len, (rows,), generator=generator)
        batch["end_positions"] = torch.randint(0, seq_len, (rows,), generator=generator)
        return batch
    if spec.fused_lm_head:
        batch["fused_lm_head"] = True
    batch["labels"] = labels
    return batch


# ---- the fit -------------------------------------------------------------------------------------------------------

def _token_monomials(spec: ProbeSpec, rows: int, seq_len: int) -> list[tuple[float, bool]]:
    """(value, quadratic in tokens) of each token monomial: for a packed row T = seq_len, else B rows of S slots."""
    if spec.layout == "packed":
        return [(1, False), (seq_len, False), (seq_len ** 2, True)]
    row_terms = [(1, False)] if spec.single_row else [(1, False), (rows, False)]
    return [(r * s, quadratic) for (r, _), (s, quadratic) in
            itertools.product(row_terms, [(1, False), (seq_len, False), (seq_len ** 2, True)])]


def _basis(monomials: list[tuple[float, bool]], widths: list[int]) -> np.ndarray:
    return np.array([m * w for m, _ in monomials for w in [1, *widths]], dtype=float)


def _token_points(spec: ProbeSpec, reprobe: bool = False) -> list[tuple[int, int]]:
    if spec.layout == "packed":
        return [(1, t) for t in (_REPROBE_PACKED_POINTS if reprobe else _PACKED_POINTS)]
    rows = (1,) if spec.single_row else (_REPROBE_ROWS_POINTS if reprobe else _ROWS_POINTS)
    return [(r, s) for r in rows for s in (_REPROBE_SEQ_POINTS if reprobe else _SEQ_POINTS)]


def _held_out_point(spec: ProbeSpec) -> tuple[int, int]:
    return _HELD_OUT["packed" if spec.layout == "packed" else "single_row" if spec.single_row else "rows"]


def _targets_of(totals: dict[tuple, int], layers: _ProbeLayers) -> dict[str, float]:
    """Per probe forward: bytes of the real model's L layers per part (each probe layer x the real layers it stands
    for), the largest single layer per kind, and the once-per-model parts."""
    targets: dict[str, float] = {}
    per_layer_total = [0.0] * len(layers.copies)
    for place, nbytes in totals.items():
        if place[0] == "layer":
            part = f"layers.{place[2]}"
            targets[part] = targets.get(part, 0.0) + nbytes * layers.weights[place[1]]
            per_layer_total[place[1]] += nbytes
        else:
            name = place[-1]
            targets[name] = targets.get(name, 0.0) + nbytes
    for kind, total in zip(layers.kinds, per_layer_total):
        targets[f"one_layer.{kind}"] = max(targets.get(f"one_layer.{kind}", 0.0), total)
    return targets


_FIT_CACHE: dict[tuple, ActivationFit] = {}
_FIT_LOCK = threading.Lock()


def _free_fit_lock_in_child() -> None:  # a fit running in another thread at a fork is not running in the child
    global _FIT_LOCK
    _FIT_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_free_fit_lock_in_child)


def activation_fit(config: Any, spec: ProbeSpec) -> ActivationFit:
    """The fitted saved-activation bytes of `config`'s model under `spec` (cached per config and spec).

    One fit at a time, on one intra-op thread: the probe's ops are tiny, and handing each to OpenMP's pool costs
    milliseconds on a busy machine (measured on 2 busy cores: 1.0 s per fit with 2 threads, 0.12 s with one).
    A fit holds the process's torch state (isolation.exclusive): its models' weights and dropout masks are its own,
    and a run training meanwhile never sees its seeds, its dtype or its thread count. The process state is taken
    before `_FIT_LOCK`, always in that order.
    """
    key = (type(config).__name__, config.to_json_string(use_diff=False), spec)
    with _FIT_LOCK:
        if key in _FIT_CACHE:
            return _FIT_CACHE[key]
    with exclusive(seed=0, threads=1), _FIT_LOCK:
        if key not in _FIT_CACHE:
            _FIT_CACHE[key] = _fit(config, spec)
        return _FIT_CACHE[key]


def _fit(config: Any, spec: ProbeSpec) -> ActivationFit:
    """Fit over the probe points, then predict a forward the fit never saw (larger tokens, every width bumped). A miss
    there means the bytes are not bilinear at these points: the fit is re-probed once over other token shapes, and
    kept with its miss (`reliable` False) if that misses too; the planner refuses an unreliable fit."""
    fit = _fit_over(config, spec, reprobe=False)
    if not fit.reliable:
        second = _fit_over(config, spec, reprobe=True)
        fit = second if second.held_out_misfit_bytes < fit.held_out_misfit_bytes else fit
    return fit


def _fit_over(config: Any, spec: ProbeSpec, reprobe: bool) -> ActivationFit:
    names = _width_names(config)
    layers = _ProbeLayers.of(config, lora=bool(spec.lora_rank))
    autocast = PRECISIONS[spec.precision].autocast
    rows_of_basis, measured = [], []
    _probe_state.kernel_heads = None
    _probe_state.kernel_saving_layers = set()
    for widths in _width_points(config, names):  # the last point bumps every width: the held-out forward's model
        model = _build_probe_model(config, widths, spec, layers)
        recorder = _SaveRecorder(model, config, len(layers.copies), spec.cuda_autocast)
        for rows, seq_len in _token_points(spec, reprobe):
            batch = _batch(config, spec, rows, seq_len, widths["vocab_size"])
            measured.append(_targets_of(recorder.run(model, batch, autocast), layers))
            rows_of_basis.append(_basis(_token_monomials(spec, rows, seq_len), [widths[n] for n in names]))
    rows, seq_len = _held_out_point(spec)
    held_out = _targets_of(recorder.run(model, _batch(config, spec, rows, seq_len, widths["vocab_size"]), autocast),
                           layers)
    held_out_widths = [widths[n] for n in names]
    targets = tuple(sorted({t for m in measured + [held_out] for t in m}))
    design = np.array(rows_of_basis)
    values = np.array([[m.get(t, 0.0) for t in targets] for m in measured])
    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    coefficients = np.linalg.lstsq(design / scale, values, rcond=None)[0] / scale[:, None]
    residual = float(np.abs(design @ coefficients - values).max()) if values.size else 0.0
    monomials = _token_monomials(spec, rows, seq_len)
    predicted = _basis(monomials, held_out_widths) @ coefficients
    misfit = max((abs(p - held_out.get(t, 0.0)) for t, p in zip(targets, predicted)), default=0.0)
    reference = ProbeReference(tuple(float(m) for m, _ in monomials), tuple(held_out_widths), held_out)
    quadratic = np.array([q for _, q in _token_monomials(spec, 2, 2) for _ in range(len(names) + 1)])
    kernel_layers = round(sum(layers.weights[layer] for layer in _probe_state.kernel_saving_layers
                              if layer is not None))
    return ActivationFit(targets, coefficients, quadratic, names, spec, residual, _probe_state.kernel_heads,
                         kernel_layers, misfit, reference)


@dataclasses.dataclass
class ProbedActivations:
    """The probe's share of the activation estimate for one real model and token shape."""

    terms: dict[str, int]  # bytes per part: layers.norms, layers.attention, ..., attention_scores_or_mask
    largest_layer_bytes: int  # one decoder layer's saved bytes (what checkpointing recomputes at a time)
    kernel_heads: tuple[int, int] | None  # (query, key/value) heads of the attention kernel left to the formulas
    kernel_layers: int  # real layers whose kernel saves for backward
    notes: list[str]
    reliable: bool = True  # False: the fit missed its held-out forward, or a term left its physical bounds


def probed_activations(config: Any, spec: ProbeSpec, rows: int, seq_len: int,
                       dropout_mask_bytes_per_element: int = 4) -> ProbedActivations:
    """Evaluate the fit for the real model at `rows` x `seq_len`.

    Layer parts come out as `layers.norms`, `layers.attention`, `layers.mlp`, `layers.layer_other`; what grows with
    the square of the tokens (masks, eager scores) is split off into `attention_scores_or_mask`. CPU dropout masks
    are float (4 bytes per element); pass 1 for CUDA's bool masks. Every fitted target is checked against its
    physical range (`ProbeReference.bound`): none may be negative or beyond the bound.
    """
    fit = activation_fit(config, spec)
    linear, quadratic = fit.evaluate(config, rows, seq_len)
    monomials, squared = zip(*_token_monomials(spec, rows, seq_len))
    widths = [_real_width(config, name) for name in fit.width_names]
    terms: dict[str, int] = {}
    largest_layer = 0
    out_of_bounds = []
    for target in fit.targets:
        bound = fit.reference.bound(target, list(monomials), widths)
        for part, quadratic_part in ((linear, False), (quadratic, True)):
            # Float sums of exact counts, extrapolated: zero is zero. Each part's rounding grows with its own
            # monomials: judged by the quadratic ones' growth, a long sequence's real linear bytes (a 64k-token
            # row's whole activations) would read as rounding and vanish.
            part_bound = fit.reference.bound(target, list(monomials), widths,
                                             [is_squared == quadratic_part for is_squared in squared])
            if abs(part[target]) <= 8 + _HELD_OUT_TOLERANCE * part_bound:
                part[target] = 0
        noise = 8 + _HELD_OUT_TOLERANCE * bound
        value = linear[target] + quadratic[target]
        if value < 0 or value > bound + noise:
            out_of_bounds.append(f"{target} {value / 2**30:,.3f} GiB (physical range 0 to {bound / 2**30:,.3f})")
        if target.startswith("one_layer."):
            largest_layer = max(largest_layer, value)
            continue
        if target.endswith("dropout_masks"):  # masks of hidden states and of attention probabilities alike
            masks = value * dropout_mask_bytes_per_element // 4
            terms["dropout_masks"] = terms.get("dropout_masks", 0) + masks
            continue
        terms[target] = terms.get(target, 0) + linear[target]
        terms["attention_scores_or_mask"] = terms.get("attention_scores_or_mask", 0) + quadratic[target]
    notes = []
    if not fit.reliable:
        notes.append(f"the probe's saved bytes are not bilinear in tokens and widths for this architecture: the fit "
                     f"missed a forward it never saw by {fit.held_out_misfit_bytes:,.0f} bytes, after a re-probe")
    if out_of_bounds:
        notes.append("fitted terms outside their physical range: " + "; ".join(out_of_bounds))
    return ProbedActivations({k: v for k, v in terms.items() if v}, largest_layer, fit.kernel_heads,
                             fit.kernel_layers, notes,
                             reliable=fit.reliable and not out_of_bounds)
