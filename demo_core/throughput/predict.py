"""`predict_throughput`: per collator, real tokens/s per GPU, seconds per optimizer step, speedup over padded, its
range and the step's breakdown. The returned dict is a contract (`plan --json` carries it as `throughput`):

    {"gpu": name, "collators": {name: {"tokens_per_s", "step_s", "speedup_vs_padded", "range": [lo, hi],
                                       "breakdown": {part: seconds per step}}}}

`range` is the speedup's: the prediction times the spread of measured / predicted speedups over the calibration rows
(10th to 90th percentile); padded's own is [1, 1].
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from demo_core.collators import BASELINE, collator_spec
from demo_core.errors import DemoInputError
from demo_core.gpus import Device
from demo_core.gpus import gpu as gpu_named
from demo_core.throughput.batches import MAX_STEPS_PRICED, Step, collator_steps
from demo_core.throughput.facts import ModelFacts, RunSettings
from demo_core.throughput.ops import ops_per_micro_batch
from demo_core.throughput.step_time import CALIBRATED, Costing, Efficiencies

# log(measured / predicted speedup) over the calibration rows, 10th and 90th percentiles: the negated 90th and 10th
# of the log(predicted / measured) residuals benchmarks/throughput_published.py prints (-0.097, +0.095).
SPEEDUP_LOG_RESIDUAL_RANGE = (-0.095, 0.097)


def collator_batches(run: RunSettings, lengths: Sequence[int], collators: Iterable[str], seed: int | None = 0,
                     max_steps: int = MAX_STEPS_PRICED) -> dict[str, list[Step]]:
    """Each collator's optimizer steps on this profile, padded's always (every speedup is against it).
    `seed`, `max_steps`: as `batches.collator_steps`."""
    names = list(dict.fromkeys([BASELINE, *collators]))
    batches = {name: collator_steps(list(lengths), collator_spec(name), run.batch_size, run.grad_accum, run.gpus,
                                    run.max_length, seed, max_steps) for name in names}
    if not batches[BASELINE]:
        raise DemoInputError("the length profile is empty")
    return batches


def price_batches(costing: Costing, batches: dict[str, list[Step]], collators: Iterable[str],
                  log_residual_range: tuple[float, float] = SPEEDUP_LOG_RESIDUAL_RANGE) -> dict[str, dict]:
    """The collators' steps (`collator_batches`) priced: real tokens/s per GPU, seconds per step, speedup over padded
    with its range, and the mean step's breakdown."""
    run = costing.run
    collators = list(collators)
    priced = {}
    for name, steps in batches.items():
        breakdowns = [costing.step_breakdown(step) for step in steps]
        total_s = sum(sum(parts.values()) for parts in breakdowns)
        real_tokens = sum(micro.real_tokens for step in steps for rank in step for micro in rank)
        mean_breakdown = {part: sum(parts[part] for parts in breakdowns) / len(steps) for part in breakdowns[0]}
        priced[name] = {"tokens_per_s": real_tokens / run.gpus / total_s, "step_s": total_s / len(steps),
                        "breakdown": mean_breakdown}
    baseline = priced[BASELINE]["tokens_per_s"]
    low, high = log_residual_range
    result = {}
    for name in batches:
        if name == BASELINE and BASELINE not in collators:
            continue
        speedup = priced[name]["tokens_per_s"] / baseline
        spread = (1.0, 1.0) if name == BASELINE else (math.exp(low), math.exp(high))
        result[name] = {"tokens_per_s": priced[name]["tokens_per_s"], "step_s": priced[name]["step_s"],
                        "speedup_vs_padded": speedup, "range": [speedup * spread[0], speedup * spread[1]],
                        "breakdown": priced[name]["breakdown"]}
    return result


def price_collators(costing: Costing, lengths: Sequence[int], collators: Iterable[str],
                    log_residual_range: tuple[float, float] = SPEEDUP_LOG_RESIDUAL_RANGE, seed: int | None = 0,
                    max_steps: int = MAX_STEPS_PRICED) -> dict[str, dict]:
    """Each collator's steps on this profile, priced (`collator_batches`, then `price_batches`)."""
    collators = list(collators)
    batches = collator_batches(costing.run, lengths, collators, seed, max_steps)
    return price_batches(costing, batches, collators, log_residual_range)


def costing_for(config: Any, run: RunSettings, device: Device, lora_targets: tuple[str, ...] = ("all-linear",),
                efficiencies: Efficiencies = CALIBRATED, **attention_path) -> Costing:
    """A model config, a run and a device priced together: the model's facts, and its own operation count."""
    facts = ModelFacts.of(config, run.lora_rank, tuple(lora_targets))
    ops = ops_per_micro_batch(config, run.gradient_checkpointing, run.lora_rank, tuple(lora_targets))
    return Costing(facts, run, device, efficiencies, ops, **attention_path)


def predict_throughput(config: Any, lengths: Sequence[int], collators: Iterable[str], batch_size: int,
                       gpu: str | Device, gpus: int = 1, shard: str = "none", precision: str = "bf16",
                       attention: str = "flash_attention_2", lora_rank: int = 0, qlora: bool = False,
                       gradient_checkpointing: bool = False, grad_accum: int = 1, max_length: int = 4096,
                       weights: str = "auto", optimizer: str = "adamw", optimizer_impl: str = "fused",
                       lora_targets: tuple[str, ...] = ("all-linear",),
                       efficiencies: Efficiencies = CALIBRATED) -> dict:
    """Predicted throughput of each collator for a model `config` on `gpus` x `gpu`, trained on examples of these
    `lengths` (a dataset's length profile in the model's tokens). `batch_size`: examples (bfd: rows) per GPU per
    micro-batch."""
    device = gpu if isinstance(gpu, Device) else gpu_named(gpu)
    run = RunSettings(batch_size=int(batch_size), gpus=int(gpus), shard=shard, precision=precision, weights=weights,
                      attention=attention, lora_rank=int(lora_rank), qlora=bool(qlora),
                      gradient_checkpointing=bool(gradient_checkpointing), grad_accum=int(grad_accum),
                      max_length=int(max_length), optimizer=optimizer, optimizer_impl=optimizer_impl)
    names = list(collators)
    if not names:
        raise DemoInputError("choose at least one collator")
    for name in names:
        collator_spec_or_error(name)
    costing = costing_for(config, run, device, tuple(lora_targets), efficiencies)
    return {"gpu": device.name, "collators": price_collators(costing, lengths, names)}


def collator_spec_or_error(name: str):
    try:
        return collator_spec(name)
    except KeyError:
        raise DemoInputError(f"unknown collator {name!r}") from None
