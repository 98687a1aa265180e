"""The planner's "how fast?": a memory plan (memory/planner.py) with each collator's speed on the request's GPU.

`planned(request)` is what `plan`, the page's planner section and `/plan` call: the plan, and its `throughput`
priced on the GPU the request names (`gpu_type`; an A100 80GB when it names none, the card the model is calibrated
on) for every collator of the registry, from the request's length profile (equal lengths without one). The request's
settings map onto the step-time model's: bf16 / fp16 autocast over fp32 or half weights, pure bf16 as half weights,
the attention the plan resolved, LoRA / QLoRA, checkpointing, the optimizer and its implementation, the GPUs and
their sharding, the micro-batches per step.
"""

from __future__ import annotations

import dataclasses

from demo_core.collators import COLLATORS
from demo_core.gpus import gpu
from demo_core.memory.plan_request import PlanRequest, load_config
from demo_core.memory.planner import Plan, dataset_lengths, plan
from demo_core.throughput.facts import ATTENTION_CHOICES, RunSettings
from demo_core.throughput.predict import costing_for, price_collators

DEFAULT_GPU = "a100-80gb"
# Examples of equal length priced when the request has no length profile (every collator's batches then agree).
EQUAL_LENGTH_EXAMPLES = 256


def run_settings(request: PlanRequest, attention: str) -> RunSettings:
    """A validated, resolved request (Plan.request) as the step-time model's run."""
    pure_half = request.precision == "pure-bf16"
    return RunSettings(
        batch_size=request.batch_size, gpus=request.gpus,
        shard="none" if request.shard == "fsdp-no-shard" else request.shard,
        precision="bf16" if pure_half else request.precision,
        weights="half" if pure_half or request.base_dtype == "half" else "fp32",
        attention=attention if attention in ATTENTION_CHOICES else "sdpa", lora_rank=request.lora_rank,
        qlora=request.qlora, gradient_checkpointing=bool(request.gradient_checkpointing),
        grad_accum=request.grad_accum, max_length=request.seq_length, optimizer=request.optimizer,
        optimizer_impl=request.optimizer_impl)


def plan_throughput(result: Plan) -> dict:
    """Each registered collator's tokens/s per GPU, step time, speedup over padded (with its range) and breakdown,
    for the plan's request on its GPU: predict.py's contract, `{"gpu", "collators": {...}}`."""
    request = result.request
    device = gpu(request.gpu_type or DEFAULT_GPU)
    lengths = (dataset_lengths(request.dataset, request.samples, request.seed) if request.dataset
               else (request.seq_length,) * EQUAL_LENGTH_EXAMPLES)
    costing = costing_for(load_config(request.model), run_settings(request, result.attention), device,
                          tuple(request.lora_targets))
    return {"gpu": device.name, "collators": price_collators(costing, lengths, list(COLLATORS))}


def planned(request: PlanRequest) -> Plan:
    """The memory plan of `request` with its `throughput`."""
    result = plan(request)
    return dataclasses.replace(result, throughput=plan_throughput(result))
