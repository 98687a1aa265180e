"""How many operations a training micro-batch dispatches: counted on the model's own code, not assumed.

Eager PyTorch pays a fixed host cost per operation (Python, the dispatcher, autograd's bookkeeping, a kernel
launch on a GPU) whatever its size, so a small model's step is priced by its operation count: a GPT-2 block (fused
Conv1D projections, learned positions) dispatches other operations than a Llama block (rotary embeddings, RMSNorm,
gated MLP). The count comes from the model itself: a copy of its config with every layer but tiny widths (the
memory probe's copy, memory/probe_model.py; the count does not depend on widths) runs one forward and backward
of a padded batch under a dispatch mode that counts every aten operation, with the run's checkpointing and LoRA.
Cached per config and settings: about 0.1 s per model on a CPU.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.utils._python_dispatch import TorchDispatchMode

from demo_core.caches import LRU
from demo_core.isolation import exclusive
from demo_core.memory.probe_model import ProbeLayers, ProbeSpec, build_probe_model, width_names, width_points
from demo_core.memory.probe_recorder import probe_batch

# The counting batch: two rows, the second padded (the padded path's mask ops included).
COUNT_ROWS, COUNT_SEQ = 2, 12


class _Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
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


def _count(config: Any, checkpointing: bool, lora_rank: int, lora_targets: tuple[str, ...]) -> int | None:
    widths = width_points(config, width_names(config))[0]
    for attention in ("sdpa", "eager"):  # a model without an sdpa path (Gemma2) runs eager
        spec = ProbeSpec(layout="masked", single_row=False, precision="fp32", attention=attention,
                         checkpointing=checkpointing, lora_rank=lora_rank, lora_targets=lora_targets)
        try:
            with exclusive(seed=0, threads=1):
                model = build_probe_model(config, widths, spec, _every_layer(config, bool(lora_rank)))
                batch = probe_batch(config, spec, COUNT_ROWS, COUNT_SEQ, widths["vocab_size"])
                return counted_ops(lambda: model(**batch).loss.backward())
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
