"""One forward of a probe model, its saved tensors attributed: bytes per (decoder layer, part) or per once-per-model
place, counted as `SavedActivationMeter` counts them (every storage once, parameters never), with the varlen /
flash kernel's own saves set aside (the estimate's formulas count them) and autocast as CUDA runs it on request.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from demo_core.memory.heads import decoder_layers, model_head
from demo_core.memory.measure import storage_key
from demo_core.memory.probe_model import ProbeSpec

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


probe_state = threading.local()


def _kernel_stand_in(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Stands in for the varlen / flash_attention_2 kernel: what it saves is set aside (the formulas count it); what
    it returns has their layout, a fresh contiguous (batch, seq, heads, head_dim) tensor that o_proj then saves."""
    probe_state.in_kernel = True
    probe_state.kernel_heads = (query.shape[1], key.shape[1])  # as the model's code shapes them
    if query.requires_grad or key.requires_grad or value.requires_grad:  # else autograd saves nothing (LoRA's layer 0)
        probe_state.kernel_saving_layers.add(getattr(probe_state, "layer", None))
    try:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=getattr(module, "is_causal", True),
                                             scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
        # a copy even when SDPA's layout makes the transpose contiguous: the varlen kernels return a new tensor
        return out.transpose(1, 2).clone(memory_format=torch.contiguous_format), None
    finally:
        probe_state.in_kernel = False


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


def _sampled_values(t: torch.Tensor) -> tuple[float, ...]:
    """Eight values along a 2-D tensor's diagonal (its corners included): equal tensors have equal samples."""
    rows = torch.linspace(0, t.shape[0] - 1, 8).long()
    columns = torch.linspace(0, t.shape[1] - 1, 8).long()
    return tuple(t.detach()[rows, columns].tolist())


class SaveRecorder:
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
        # The weights in each half dtype by a few of their values, made once: a forward saves many 2-D half tensors,
        # and converting and comparing every weight of the same shape for each was over half of a hybrid's plan
        # (LFM2-1.2B under QLoRA: over 5 minutes). Nothing updates the weights while the recorder counts.
        self._weights_in: dict[tuple[tuple[int, ...], torch.dtype], dict[tuple, list[torch.Tensor]]] = {}

    def _enter_module(self, module: torch.nn.Module, *_: Any) -> None:
        self.stack.append(module)

    def _leave_module(self, *_: Any) -> None:
        self.stack.pop()

    def _enter_layer(self, index: int) -> None:
        self.layer = probe_state.layer = index

    def _leave_layer(self) -> None:
        self.layer, self.after_layers = None, True
        probe_state.layer = None

    def _is_weight_copy(self, t: torch.Tensor) -> bool:
        """Autocast's half copy of a weight (the formulas count those): a 2-D half tensor holding a weight's values.
        By value, not by shape: a token tensor can take a weight's shape (TRL's fused head saves the hidden states
        of B x (S-1) tokens as one 2-D tensor, 2 x 12 = 24 rows like a 24-wide layer), and counting it as a copy
        made the fit miss whole tensors."""
        if t.dim() != 2 or t.dtype == torch.float32:
            return False
        key = (tuple(t.shape), t.dtype)
        if key not in self._weights_in:
            by_values: dict[tuple, list[torch.Tensor]] = {}
            for weight in self.weights_by_shape.get(key[0], ()):
                copy = weight.to(t.dtype)
                by_values.setdefault(_sampled_values(copy), []).append(copy)
            self._weights_in[key] = by_values
        candidates = self._weights_in[key]
        return bool(candidates) and any(torch.equal(t, weight) for weight in candidates.get(_sampled_values(t), ()))

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

        def record(t: torch.Tensor) -> None:
            key = storage_key(t)
            if key[:2] in self.param_keys or key in kernel_keys or (autocast and self._is_weight_copy(t)):
                return
            if getattr(probe_state, "in_kernel", False):
                kernel_keys.add(key)
                return
            keep.append(t)
            mask = self._is_dropout_mask(t)
            if self.layer is not None:
                place = ("layer", self.layer, "dropout_masks" if mask else _part_of(self.stack))
            else:
                place = ("model", "dropout_masks" if mask else "head_and_loss" if self.after_layers else "embeddings")
            seen.setdefault(key, [key[2], place, set()])[2].add(place[:2])

        def pack(t: torch.Tensor) -> torch.Tensor:
            record(t)
            # Detached (same storage): a saved output packed as itself holds its own grad_fn, a cycle through C++
            # that gc cannot break when no backward runs, as here (torch's saved_tensors_hooks docstring; issue
            # pytorch/pytorch#115255). Packed as itself, every probe forward's graph stayed: ~190 MB per plan.
            return t.detach()

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


def probe_batch(config: Any, spec: ProbeSpec, rows: int, seq_len: int, vocab: int) -> dict:
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
