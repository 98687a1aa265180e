"""How much arithmetic one training step does, under a plain FLOP model: the basis of the work ideal speedup.

The slots ideal (padded slots / real tokens) assumes a step's time is proportional to the token slots it computes.
Attention is not: under varlen / flash_attention_2 the padded baseline also skips padding inside attention, so that
part of a step cannot shrink with packing. `step_flops` counts both parts, and the work ideal is padded's FLOPs per
real token over a collator's: the most packing can gain on this model and data when every FLOP costs the same.

Linear layers: 2 FLOPs per weight per computed token slot. Attention per layer: 4 FLOPs per head dimension per
(query, key) score pair computed: causal pairs s(s+1)/2 per segment for varlen / flash, every pair of the row when
SDPA or eager take an explicit mask (padded rows: L², a packed row with its block mask: T²). Training = 3x forward
(backward costs about twice the forward).
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.pytorch_utils import Conv1D

from demo_core.config import PER_SEGMENT_ATTENTION  # the others multiply a full (masked) score matrix
from demo_core.memory.heads import head_dim
from demo_core.step_statistics import profiled_steps, timed_step_indices


@dataclasses.dataclass(frozen=True)
class WorkModel:
    linear_weights: int  # weights of every matmul layer (Linear, and GPT-2's Conv1D), the LM head included
    attention_width: int  # query heads x head dimension
    layers: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> "WorkModel":
        config = model.config
        weights = sum(module.weight.numel() for module in model.modules()
                      if isinstance(module, (torch.nn.Linear, Conv1D)))
        return cls(weights, config.num_attention_heads * head_dim(config), config.num_hidden_layers)


def step_flops(work: WorkModel, lengths: list[int], layout: str, attention: str) -> float:
    """Training FLOPs of one step on examples of these `lengths`, batched as `layout` (a CollatorSpec layout)."""
    padded = layout == "padded"
    slots = len(lengths) * max(lengths) if padded else sum(lengths)
    # The naive row has no boundaries: one segment of the whole row.
    segments = [sum(lengths)] if layout == "naive" else lengths
    if attention in PER_SEGMENT_ATTENTION:
        pairs = sum(n * (n + 1) // 2 for n in segments)
    else:
        pairs = len(lengths) * max(lengths) ** 2 if padded else sum(lengths) ** 2
    return 3 * (2 * work.linear_weights * slots + 4 * work.attention_width * pairs * work.layers)


# ---- the slots ideal: padded slots over real tokens, step by step ---------------------------------------------

def padded_step_costs(examples: list[list[int]], batch_size: int, steps: int, grad_accum: int = 1,
                      world_size: int = 1) -> list[tuple[int, int]]:
    """(real tokens, padded slots) per optimizer step for padding to the batch's longest, batching as the Trainer
    does: in order, epoch after epoch, each device's micro-batch of batch_size / (grad_accum x world_size) examples
    padded to its own longest, the last micro-batch of an epoch holding what is left (no wrap-around into the next)
    and the last step of an epoch the micro-batches left. Under DDP each step's micro-batch is world_size
    consecutive shares, one per rank."""
    share = batch_size // (grad_accum * world_size)
    chunks = [examples[start:start + share] for start in range(0, len(examples), share)]
    costs = [(sum(len(ids) for ids in chunk), len(chunk) * max(len(ids) for ids in chunk)) for chunk in chunks]
    micro_batches = [costs[start:start + world_size] for start in range(0, len(costs), world_size)]
    epoch = [micro_batches[start:start + grad_accum] for start in range(0, len(micro_batches), grad_accum)]
    return [tuple(sum(cost[part] for micro_batch in step for cost in micro_batch) for part in (0, 1))
            for step in (epoch[index % len(epoch)] for index in range(steps))]


def ideal_speedup(examples: list[list[int]], batch_size: int, steps: int, world_size: int = 1,
                  profiled: list[int] | None = None, grad_accum: int = 1) -> float:
    """Padded slots / real tokens over the timed steps (all steps when none is timed): the speedup if step time
    were proportional to slots. `profiled`: the 1-based steps left out as profiled (None: the bursts' own,
    step_statistics.profiled_steps).

    Under DDP each rank pads only its own share of each micro-batch (consecutive shares of the global batch).
    """
    costs = padded_step_costs(examples, batch_size, steps, grad_accum, world_size)
    profiled = profiled_steps(steps) if profiled is None else profiled
    timed = [costs[index] for index in timed_step_indices(steps, profiled)] or costs
    return sum(slots for _, slots in timed) / sum(real for real, _ in timed)
