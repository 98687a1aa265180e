"""A run's predicted speedups of every collator over padded, for the results to show beside the measured ones
("predicted 1.7×, measured 1.9×"): the step-time model checked on every run anyone makes.

The engine's own batches are priced (the data in its trained order, the run's steps, its micro-batch and
accumulation), on the device the run trained on:
- a CPU: priced at this machine's rates, measured once per process and thread count (cpu_rates.py, about 0.3 s),
  fp32 as CPU bursts train, no host/device overlap, the varlen path's SDPA per bucket of similar lengths;
- a GPU the table knows (gpus.py, matched by torch's device name): at its datasheet rates and the calibrated
  efficiencies; a GPU it does not know gets no prediction (None).

`gpu_predictions` answers the preview's "and on a GPU?": the same comparison (the same batches) on every GPU of the
table, with what "auto" would resolve to there (bf16 where the card has it, else fp16; the per-segment varlen path).
"""

from __future__ import annotations

import functools
from typing import Any

from demo_core.config import RunConfig
from demo_core.gpus import GPUS, Device, gpu_for_device_name
from demo_core.throughput.cpu_rates import CpuRates, bucket_ops, bucket_pairs, cpu_device, measure_cpu_rates
from demo_core.throughput.facts import RunSettings
from demo_core.throughput.predict import costing_for, price_collators

# What the table's precisions are called in a run (RunConfig.precision, resolved).
_RUN_PRECISIONS = {"fp32": ("fp32", "auto"), "bf16": ("bf16", "auto"), "fp16": ("fp16", "auto"),
                   "pure-bf16": ("bf16", "half")}


@functools.lru_cache(maxsize=4)
def process_cpu_rates(threads: int | None) -> CpuRates:
    """This CPU's rates at `threads`, measured once per process: the machine does not change between runs."""
    return measure_cpu_rates(threads)


def _settings(run: RunConfig, precision: str, weights: str, attention: str) -> RunSettings:
    return RunSettings(batch_size=run.batch_size, grad_accum=run.grad_accum, precision=precision,  # per device
                       weights=weights, attention=attention, lora_rank=run.lora_rank, qlora=run.qlora,
                       gradient_checkpointing=bool(run.gradient_checkpointing), max_length=run.max_length,
                       optimizer=run.optimizer)


def _run_priced(run: RunConfig, costing, lengths: list[int]) -> dict[str, dict]:
    # The engine's own batches: the data in its trained order, the run's steps
    return price_collators(costing, lengths, run.collators, log_residual_range=(0.0, 0.0), seed=None,
                           max_steps=run.steps)


def _priced(run: RunConfig, costing, lengths: list[int]) -> dict[str, float]:
    return {name: entry["speedup_vs_padded"] for name, entry in _run_priced(run, costing, lengths).items()}


def _cpu_costing(run: RunConfig, model_config: Any, rates: CpuRates | None = None):
    """This CPU at its measured rates, fp32 as CPU bursts train, the varlen path's SDPA per bucket of lengths."""
    rates = rates or process_cpu_rates(run.threads)
    device, efficiencies = cpu_device(rates)
    attention = run.attention if run.attention in ("varlen", "sdpa", "eager") else "sdpa"
    varlen = attention == "varlen"
    return costing_for(model_config, _settings(run, "fp32", "auto", attention), device, tuple(run.lora_targets),
                       efficiencies, segment_pairs=bucket_pairs if varlen else None,
                       segment_calls=bucket_ops if varlen else None)


def _gpu_costing(run: RunConfig, model_config: Any, device: Device):
    """A GPU of the table at its datasheet rates and the calibrated efficiencies."""
    precision, weights = _RUN_PRECISIONS.get(run.precision, ("bf16", "auto"))
    attention = run.attention if run.attention in ("flash_attention_2", "varlen", "sdpa", "eager") else "sdpa"
    return costing_for(model_config, _settings(run, precision, weights, attention), device, tuple(run.lora_targets))


def predicted_speedups(run: RunConfig, model_config: Any, lengths: list[int], rates: CpuRates | None = None
                       ) -> dict[str, float]:
    """Predicted speedup over padded of each collator of a resolved run (`RunConfig.resolved`) on this CPU, for its
    examples' `lengths` in their trained order."""
    return _priced(run, _cpu_costing(run, model_config, rates), lengths)


def priced_for_run(run: RunConfig, model_config: Any, lengths: list[int], device_name: str | None = None
                   ) -> dict[str, dict] | None:
    """Each collator of a resolved run priced on the device it trains on (`tokens_per_s`, `step_s`,
    `speedup_vs_padded`...); `device_name`: torch's name of the CUDA device (None on a CPU). None where the model
    has no entry for the device."""
    if run.device == "cpu":
        return _run_priced(run, _cpu_costing(run, model_config), lengths)
    device = gpu_for_device_name(device_name or "")
    return None if device is None else _run_priced(run, _gpu_costing(run, model_config, device), lengths)


def gpu_predictions(asked: RunConfig, resolved: RunConfig, model_config: Any, lengths: list[int]) -> dict:
    """The same comparison on each GPU of the table: `{name: {"label", "collators": {collator: {"tokens_per_s",
    "step_s", "speedup_vs_padded"}}}}`. `asked`: the run as asked (its "auto" precision and attention resolve as a
    GPU would resolve them), `resolved`: as it trains here (its batches)."""
    predictions = {}
    for name, device in GPUS.items():
        precision = asked.precision if asked.precision != "auto" else ("bf16" if device.bf16_flops else "fp16")
        table_precision, weights = _RUN_PRECISIONS.get(precision, ("bf16", "auto"))
        attention = asked.attention if asked.attention in ("flash_attention_2", "varlen", "sdpa", "eager") \
            else "varlen"
        costing = costing_for(model_config, _settings(resolved, table_precision, weights, attention), device,
                              tuple(resolved.lora_targets))
        priced = _run_priced(resolved, costing, lengths)
        predictions[name] = {"label": device.label, "collators": {
            collator: {key: entry[key] for key in ("tokens_per_s", "step_s", "speedup_vs_padded")}
            for collator, entry in priced.items()}}
    return predictions
