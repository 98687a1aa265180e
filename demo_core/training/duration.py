"""How long a run will take, predicted from its size before it starts (to size and refuse GPU allocations).

A run is, per collator, a setup (a fresh model, its Trainer, the warm-up step) and then `steps` optimizer steps. A
step's time grows with the token slots it computes: rows × longest example when padded, the real tokens when
packed into one row, full rows of `max_length` for best-fit-decreasing. Seconds per slot come from earlier runs of
the same model on the same device and precision when the history has one (the median of the last few: one run on a
busy machine should not inflate every later estimate); else, on a GPU the step-time model knows (a GPU Space), its
prediction for the run's own batches on that GPU (throughput/run_prediction.py); else from the parameter count: 6
FLOPs per parameter per token for forward and backward (Kaplan et al. 2020, "Scaling laws", section 2.1) at a
deliberately low sustained rate, plus a per-step overhead. The estimate only has to be roughly right: a run that
outgrows it stops itself at its time budget (`serving.stop`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Iterable

from demo_core.config import RunConfig
from demo_core.memory.parameters import param_facts
from demo_core.settings import declared, speed_names
from demo_core.step_statistics import timed_step_indices
from demo_core.throughput.work import padded_step_costs
from demo_core.training.prepared import Prepared

# Assumptions, replaced by measured rates once the history has a run of the model on the device:
# - CPU: tiny-llama trains at ≈5e10 FLOP/s on 2 idle cores (a default `compare` run: ~14,000 padded slots/s at 0.59M
#   params, 6 FLOPs per parameter and slot); 1e10 leaves room for a machine shared with other work (the same run
#   measured 3-40x slower under load).
# - CUDA: an H200 peaks near 1e15 bf16 FLOP/s; short bursts of ≤1B models reach a small fraction, so 5e13.
SUSTAINED_FLOPS = {"cpu": 1e10, "cuda": 5e13}
# Per step: Trainer bookkeeping, the optimizer, kernel launches (what dominates for tiny models).
STEP_OVERHEAD_S = {"cpu": 0.05, "cuda": 0.1}
# Per collator: building the model (random init on the CPU: seconds for 1B parameters), the Trainer, the warm-up step.
SETUP_S = {"cpu": 5.0, "cuda": 15.0}
RECENT_RUNS = 10  # how many earlier results of the same kind of run the measured rate is the median of
# A run predicted longer than this is `long` in preview()'s `predicted`: a minute is longer than a visitor watches a
# progress bar without being told first (a default CPU run, 2 collators x 20 steps of tiny-llama, takes ~15 s).
LONG_RUN_S = 60.0


@dataclasses.dataclass(frozen=True)
class RunEstimate:
    setup_s: float  # per collator
    step_s: dict[str, float]  # per collator: seconds per optimizer step
    steps: int
    basis: str  # "history" (earlier runs), "model" (the step-time model on a GPU) or "parameters" (parameter count)

    @property
    def total_s(self) -> float:
        return len(self.step_s) * self.setup_s + self.steps * sum(self.step_s.values())

    @property
    def first_step_s(self) -> float:
        """Setup plus the slowest collator's step: what the first step may cost before one is measured."""
        return self.setup_s + max(self.step_s.values())

    def steps_within(self, seconds: float) -> int:
        """The most steps per collator that fit in `seconds` (0 when not even the setups fit)."""
        return max(0, math.floor((seconds - len(self.step_s) * self.setup_s) / sum(self.step_s.values())))


def slots_per_step(prepared: Prepared) -> dict[str, float]:
    """Token slots one step computes, per collator, averaged over one pass through the data: the same for any
    number of steps, so that a run's predicted time is linear in its steps."""
    config, examples = prepared.config, prepared.examples
    per_step = config.examples_per_step
    costs = padded_step_costs(examples, per_step, math.ceil(len(examples) / per_step), config.grad_accum)
    real = sum(tokens for tokens, _ in costs) / len(costs)
    padded = sum(slots for _, slots in costs) / len(costs)
    total_tokens = sum(len(ids) for ids in examples)
    slots = {}
    for spec in prepared.specs:
        if spec.packed_rows:  # rows filled up to max_length (an upper bound: the last rows are emptier)
            slots[spec.name] = min(per_step * config.max_length, total_tokens)
        else:
            slots[spec.name] = padded if spec.layout == "padded" else real
    return slots


def speed_key(config: dict) -> tuple:
    """What the seconds a token slot takes depend on, read from a document's `config`: every setting declared with
    `speed=True` (config.py), at the value the engine resolved where it decided one (`resolved_attention`...), at its
    declared default in a document saved before the setting existed."""
    defaults = {item.name: item.default for item in declared(RunConfig)}
    values = (config.get(f"resolved_{name}", config.get(name, defaults[name])) for name in speed_names(RunConfig))
    return tuple(tuple(value) if isinstance(value, list) else value for value in values)


def measured_seconds_per_slot(documents: Iterable[dict], speed: tuple) -> float | None:
    """The median seconds per token slot of the most recent results of runs whose `speed_key` is `speed`: the same
    model on the same device, precision and attention, training the same way (LoRA's backward skips the frozen
    weights' gradients; checkpointing recomputes the forward)."""
    rates = []
    for document in reversed(list(documents)):
        if speed_key(document.get("config", {})) != speed:
            continue
        for result in document.get("results", []):
            # the steps throughput counts: not the warm-up, not the profiled steps (the profiler slows them)
            timed = timed_step_indices(len(result["step_times_s"]),
                                       result.get("profiled_steps") or result.get("profiled_step"))
            times = [result["step_times_s"][index] for index in timed]
            slots = [result["step_padded_slots"][index] for index in timed]
            if times and sum(slots):
                rates.append(sum(times) / sum(slots))
        if len(rates) >= RECENT_RUNS:
            break
    return statistics.median(rates) if rates else None


def estimate(prepared: Prepared, measured_s_per_slot: float | None = None) -> RunEstimate:
    """Seconds per step measured in earlier runs of the same kind when there are some; else, on a GPU the step-time
    model knows, its prediction for this run's own batches on that GPU (throughput/step_time.py, calibrated on
    published GPU runs); else the parameter count. A CPU keeps the parameter count: its step-time model runs at rates
    measured in a fraction of a second, which a shared machine's load moves 3-40x within a run (docs/THROUGHPUT.md),
    and this estimate must err slow, since it sizes the run's time budget."""
    device = prepared.resolved.device
    if measured_s_per_slot is not None:
        step_s = {name: n * measured_s_per_slot for name, n in slots_per_step(prepared).items()}
        basis = "history"
    elif device == "cuda" and (modelled := prepared.priced_on_device) is not None:
        step_s = {name: entry["step_s"] for name, entry in modelled.items()}
        basis = "model"
    else:
        flops_per_slot = 6 * param_facts(prepared.source.config).params
        step_s = {name: STEP_OVERHEAD_S[device] + n * flops_per_slot / SUSTAINED_FLOPS[device]
                  for name, n in slots_per_step(prepared).items()}
        basis = "parameters"
    return RunEstimate(SETUP_S[device], step_s, prepared.config.steps, basis)


def predicted(prepared: Prepared, earlier_runs: Iterable[dict] = (), long_after_s: float = LONG_RUN_S) -> dict:
    """The run's predicted time on this machine, before it starts, as preview() reports it: `duration_s` (every
    collator's setup and steps), `basis` ("history": seconds per slot measured in `earlier_runs`, the documents of
    earlier runs of the same kind; "model": the step-time model on this GPU; "parameters": from the parameter count,
    deliberately pessimistic), `setup_s` per collator, `step_s` per collator, and `long` when it is over
    `long_after_s`."""
    measured = measured_seconds_per_slot(earlier_runs, speed_key(prepared.document_config()))
    run = estimate(prepared, measured)
    return {"duration_s": run.total_s, "basis": run.basis,
            "setup_s": run.setup_s, "step_s": dict(run.step_s), "long": run.total_s > long_after_s,
            "long_after_s": long_after_s}
