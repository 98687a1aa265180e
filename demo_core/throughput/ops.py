"""How many operations a training micro-batch dispatches: counted on the model's own code, not assumed.

Eager PyTorch pays a fixed host cost per operation (Python, the dispatcher, autograd's bookkeeping, a kernel
launch on a GPU) whatever its size, so a small model's step is priced by its operation count: a GPT-2 block (fused
Conv1D projections, learned positions) dispatches other operations than a Llama block (rotary embeddings, RMSNorm,
gated MLP). The count comes from the model itself: a copy of its config with every layer but tiny widths (the
memory probe's copy, memory/probe_model.py; the count does not depend on widths) runs one forward and backward
of a padded batch under a dispatch mode that counts every aten operation, with the run's checkpointing and LoRA.
Cached per config and settings: about 0.1 s per model on a CPU.

A copy of every layer is not built when it would hold more than EVERY_LAYER_BUDGET_PARAMS weights: fields the probe
keeps at their real size stay large in each layer (DeepSeek-V3's 61 layers with MLA's real ranks: 2.4B weights,
16 GB on the CPU). Then the memory probe's own layers (two per kind) run: each one's operations, forward and
backward, count for the real layers it stands for, and those outside the layers once (`_scaled_count`); the same
count as every layer's, where the layers of a kind dispatch alike.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from demo_core.caches import LRU
from demo_core.isolation import exclusive
from demo_core.memory.heads import decoder_layers, model_class_for
from demo_core.memory.probe_model import (
    ProbeLayers,
    ProbeSpec,
    build_probe_model,
    probe_config,
    width_names,
    width_points,
)
from demo_core.memory.probe_recorder import probe_batch

# The counting batch: two rows, the second padded (the padded path's mask ops included).
COUNT_ROWS, COUNT_SEQ = 2, 12
# The largest copy of every layer counted as it is: 50M fp32 weights, 0.2 GB.
EVERY_LAYER_BUDGET_PARAMS = 50_000_000


class _Counter(TorchDispatchMode):
    """Counts operations, and in `by_layer` by the decoder layer whose forward or backward dispatched them (`layer`,
    None outside every layer)."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.layer: int | None = None
        self.by_layer: dict[int | None, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.by_layer[self.layer] = self.by_layer.get(self.layer, 0) + 1
        return func(*args, **(kwargs or {}))


def counted_ops(work: Callable[[], object]) -> int:
    """Aten operations `work` dispatches (its backward's included)."""
    counter = _Counter()
    with counter:
        work()
    return counter.count


def _every_layer(config: Any, lora: bool) -> ProbeLayers:
    """The probe copy's layers, one per real layer (the probe keeps two per kind): the real model's layers as they
    are (`prefix`), each counted once; the kinds only matter to the probe's fit, which a count does not make."""
    layers = int(config.num_hidden_layers)
    return ProbeLayers(ProbeLayers.of(config, lora).lists, (), tuple(range(layers)), (1.0,) * layers, (0,) * layers,
                       prefix=True)


def _parameters(config: Any, widths: dict[str, int], layers: ProbeLayers) -> int:
    """Weights of the probe copy of `layers`, counted on the meta device (nothing allocated)."""
    small = probe_config(config, widths, layers)
    with exclusive(), torch.device("meta"):
        model = model_class_for(small).from_config(small)
    return sum(parameter.numel() for parameter in model.parameters())


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def _scaled_count(model: torch.nn.Module, batch: dict, layers: ProbeLayers) -> int:
    """The operations of the real model from a copy of some of its layers: each copied layer's operations (its
    forward, and its backward with checkpointing's recomputed forward) times the real layers it stands for, plus
    the operations outside the layers (embeddings, masks, rotary tables, head and loss) once. A layer's backward
    runs from the gradient of its output to the gradient of its input: gradient hooks on those hidden states tell
    the counter which layer the backward is in."""
    counter = _Counter()
    modules = decoder_layers(model, len(layers.copies))

    def set_layer(index: int | None):
        def hook(*_):
            counter.layer = index
        return hook

    def entering(index: int):
        def hook(module, args, kwargs):
            counter.layer = index
            hidden = _first_tensor(args) if args else _first_tensor(kwargs.get("hidden_states"))
            if hidden is not None and hidden.requires_grad:  # its gradient ends this layer's backward
                hidden.register_hook(set_layer(index - 1 if index else None))
        return hook

    def leaving(index: int):
        def hook(module, args, output):
            counter.layer = None
            hidden = _first_tensor(output)
            if hidden is not None and hidden.requires_grad:  # its gradient starts this layer's backward
                hidden.register_hook(set_layer(index))
        return hook

    hooks = [module.register_forward_pre_hook(entering(index), with_kwargs=True)
             for index, module in enumerate(modules)]
    hooks += [module.register_forward_hook(leaving(index)) for index, module in enumerate(modules)]
    try:
        with counter:
            model(**batch).loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    return round(counter.by_layer.get(None, 0) + sum(weight * counter.by_layer.get(index, 0)
                                                     for index, weight in enumerate(layers.weights)))


def _count(config: Any, checkpointing: bool, lora_rank: int, lora_targets: tuple[str, ...]) -> int | None:
    widths = width_points(config, width_names(config))[0]
    for attention in ("sdpa", "eager"):  # a model without an sdpa path (Gemma2) runs eager
        spec = ProbeSpec(layout="masked", single_row=False, precision="fp32", attention=attention,
                         checkpointing=checkpointing, lora_rank=lora_rank, lora_targets=lora_targets)
        try:
            with exclusive(seed=0, threads=1):
                every_layer = _every_layer(config, bool(lora_rank))
                batch = probe_batch(config, spec, COUNT_ROWS, COUNT_SEQ, widths["vocab_size"])
                if _parameters(config, widths, every_layer) <= EVERY_LAYER_BUDGET_PARAMS:
                    model = build_probe_model(config, widths, spec, every_layer)
                    return counted_ops(lambda: model(**batch).loss.backward())
                some_layers = ProbeLayers.of(config, bool(lora_rank))
                return _scaled_count(build_probe_model(config, widths, spec, some_layers), batch, some_layers)
        except (ValueError, TypeError, RuntimeError, ImportError, KeyError, AttributeError):
            continue  # this attention path does not build or run for the architecture: try the next
    return None


def ops_per_micro_batch(config: Any, checkpointing: bool, lora_rank: int = 0,
                        lora_targets: tuple[str, ...] = ("all-linear",)) -> int | None:
    """Aten operations of one micro-batch's forward and backward (checkpointing's recomputed forward included);
    None when the model's tiny copy cannot run on this CPU."""
    key = (type(config).__name__, config.to_json_string(use_diff=False), bool(checkpointing), int(lora_rank),
           tuple(lora_targets))
    if key not in _COUNTS:  # None (a model whose tiny copy cannot run here) is cached too
        _COUNTS[key] = count = _count(config, *key[2:])
        return count
    return _COUNTS.get(key)


_COUNTS: LRU = LRU(max_entries=64)
