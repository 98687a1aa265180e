"""The step-time model next to every published padded-vs-packed GPU measurement found: docs/THROUGHPUT.md's table.

    python benchmarks/throughput_published.py               # the table, the error statistics, the naive baseline
    python benchmarks/throughput_published.py --calibrate   # refit the calibrated efficiencies on the calibration rows

Each row is one source's setting as stated (what it leaves unstated is named in `assumed`), its measured speedup of
the packed collator over padding (ratio of real tokens per second, or of time on the same examples) and, where the
source gives them, real tokens per second per GPU of both. The model predicts each from the model's config, the
dataset's length profile, the batch and the GPU. Rows marked `calibrate` fitted the efficiencies in
demo_core/throughput/step_time.py (`--calibrate` refits them); the others are held out. Rows the model cannot
represent (fused kernels it does not know, an unstated GPU or dataset) are listed with why, and left out of the
statistics. Runs nothing on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from throughput_rows import CONFIGS, NOT_MODELLED, PROFILES, ROWS, PublishedRow  # noqa: E402  (beside this script)

from demo_core.memory.plan_request import load_config  # noqa: E402
from demo_core.throughput import CALIBRATED, Efficiencies, gpu  # noqa: E402
from demo_core.throughput.batches import MAX_STEPS_PRICED  # noqa: E402
from demo_core.throughput.facts import ModelFacts, RunSettings  # noqa: E402
from demo_core.throughput.predict import collator_batches, costing_for, price_batches  # noqa: E402

CALIBRATION_STEPS = 24
SPEEDUP_WEIGHT = 3


_CONFIGS: dict = {}


def _config_of(model: str):
    if model not in _CONFIGS:
        _CONFIGS[model] = CONFIGS[model]() if model in CONFIGS else load_config(model)
    return _CONFIGS[model]


_BATCHES: dict = {}  # (row, steps) -> each collator's steps: they do not depend on the efficiencies


def predict_row(row: PublishedRow, efficiencies: Efficiencies = CALIBRATED, max_steps: int = MAX_STEPS_PRICED) -> dict:
    run = dict(row.run)
    device = gpu(run.pop("gpu"))
    lora_targets = run.pop("lora_targets", ("all-linear",))
    settings = RunSettings(**run)
    key = (id(row), max_steps)
    if key not in _BATCHES:
        _BATCHES[key] = collator_batches(settings, PROFILES[row.profile], [row.collator], max_steps=max_steps)
    costing = costing_for(_config_of(row.model), settings, device, lora_targets, efficiencies)
    return price_batches(costing, _BATCHES[key], ["padded", row.collator])


def naive_speedup(row: PublishedRow) -> float:
    """The slots-only model: padded slots / real tokens of the same examples (bfd: the same as flatten)."""
    predicted = predict_row(row, Efficiencies(matmul_half_tokens_per_ridge=0.0, attention_efficiency=1e9,
                                              ssm_efficiency=1e9, memory_efficiency=1e9, dequant_efficiency=1e9,
                                              sharded_dequant_efficiency=1e9, comm_efficiency=1e9, host_s_per_op=0.0,
                                              kernel_s_per_op=0.0, step_fixed_s=0.0))
    return predicted[row.collator]["speedup_vs_padded"]


def _errors(row: PublishedRow, efficiencies: Efficiencies, max_steps: int = MAX_STEPS_PRICED
            ) -> tuple[float, list[float]]:
    predicted = predict_row(row, efficiencies, max_steps)
    speedup_error = predicted[row.collator]["speedup_vs_padded"] / row.measured_speedup - 1
    throughput = [predicted[name]["tokens_per_s"] / measured - 1 for name, measured in
                  (("padded", row.padded_tokens_per_s), (row.collator, row.packed_tokens_per_s)) if measured]
    return speedup_error, throughput


# Fractions of a rate are at most 1; large GEMMs reach 80-90% of an A100's or H100's dense peak in cuBLAS, never more.
UPPER_BOUNDS = {"matmul_efficiency": 0.9, "comm_overlap": 1.0, "dequant_efficiency": 1.0,
                "sharded_dequant_efficiency": 1.0, "comm_efficiency": 1.0, "expert_matmul_efficiency": 1.0}
GRID_MATMUL_EFFICIENCY = (0.65, 0.75, 0.85, 0.9)
GRID_HALF_TOKENS_PER_RIDGE = (1.0, 1.5, 2.0, 3.0, 4.0)
# The roofline: below its ridge point a GEMM is bound by reading its weights, so its half-rate point is never under it.
LOWER_BOUNDS = {"matmul_half_tokens_per_ridge": 1.0}
CALIBRATED_FIELDS = ("matmul_efficiency", "matmul_half_tokens_per_ridge", "dequant_efficiency",
                     "sharded_dequant_efficiency", "comm_efficiency", "comm_overlap", "step_fixed_s")
# Each parameter is fitted on the rows it prices: the experts' on the mixture-of-experts rows alone, after the rest
# (shared by every row) on the dense ones.
EXPERT_FIELDS = ("expert_matmul_efficiency",)


def is_moe(row: PublishedRow) -> bool:
    return bool(ModelFacts.of(_config_of(row.model)).experts)


def calibrate(rows: list[PublishedRow], start: Efficiencies = CALIBRATED) -> Efficiencies:
    """The dense rows' fit, then the experts' on the mixture-of-experts rows (`fit`)."""
    dense = fit([row for row in rows if not is_moe(row)], start, CALIBRATED_FIELDS, grid=True)
    moe = [row for row in rows if is_moe(row)]
    return fit(moe, dense, EXPERT_FIELDS, grid=False) if moe else dense


def fit(rows: list[PublishedRow], start: Efficiencies, fields: tuple[str, ...], grid: bool) -> Efficiencies:
    """Absolute log errors over the calibration rows (the targets are medians: a row the model cannot represent
    should not pull every other one), speedups weighing SPEEDUP_WEIGHT and each tokens/s 1 (on the
    first CALIBRATION_STEPS steps of each row, for speed): the best point of a grid over the GEMMs' two parameters
    (the loss has several valleys along them), then coordinate descent in log space over every calibrated field.
    The speedup is what the model is for; tokens/s also carry what the rows' machines differ in (their clocks,
    links, software), which the speedup mostly cancels."""
    def loss(candidate: Efficiencies) -> float:
        total = 0.0
        for row in rows:
            speedup_error, throughput = _errors(row, candidate, CALIBRATION_STEPS)
            total += SPEEDUP_WEIGHT * abs(math.log1p(speedup_error)) + sum(abs(math.log1p(error))
                                                                           for error in throughput)
        return total

    points = [dataclasses.replace(start, matmul_efficiency=efficiency, matmul_half_tokens_per_ridge=half)
              for efficiency in GRID_MATMUL_EFFICIENCY for half in GRID_HALF_TOKENS_PER_RIDGE] if grid else []
    best = min([start, *points], key=loss)
    best_loss = loss(best)
    for step in (1.3, 1.08):
        improved = True
        while improved:
            improved = False
            for field in fields:
                for factor in (step, 1 / step):
                    value = getattr(best, field) * factor
                    if value > UPPER_BOUNDS.get(field, math.inf) or value < LOWER_BOUNDS.get(field, 0.0):
                        continue
                    candidate = dataclasses.replace(best, **{field: value})
                    candidate_loss = loss(candidate)
                    if candidate_loss < best_loss - 1e-9:
                        best, best_loss, improved = candidate, candidate_loss, True
    return best


def _stats(errors: list[float]) -> str:
    absolute = [abs(error) for error in errors]
    return (f"median |error| {100 * statistics.median(absolute):.1f}%, within 10%: "
            f"{sum(error <= 0.10 for error in absolute)}/{len(absolute)}") if errors else "no rows"


def _short_source(source: str) -> str:
    """The table's source cell: the file, PR or paper number the full URL ends with."""
    address = source.split(" ")[0].rstrip("/")
    parts = address.split("/")
    return f"{parts[-3]} #{parts[-1]}" if parts[-2] in ("pull", "issues") else parts[-1]


def _measured(tokens_per_s: float | None) -> str:
    return "–" if tokens_per_s is None else f"{tokens_per_s:.0f}"


def report(efficiencies: Efficiencies) -> None:
    print("| source | setting | collator | measured | predicted | error | naive | naive error | padded tok/s/GPU "
          "measured / predicted | packed tok/s/GPU measured / predicted | split |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    # speedup errors, tokens/s errors, naive speedup errors, whether the measured speedup is inside the stated range
    groups = {True: ([], [], [], []), False: ([], [], [], [])}
    for row in ROWS:
        predicted = predict_row(row, efficiencies)
        speedup = predicted[row.collator]["speedup_vs_padded"]
        naive = naive_speedup(row)
        speedup_error, throughput = _errors(row, efficiencies)
        speedups, tokens, naives, in_range = groups[row.calibrate]
        low, high = predicted[row.collator]["range"]
        in_range.append(low <= row.measured_speedup <= high)
        speedups.append(speedup_error)
        tokens.extend(throughput)
        naives.append(naive / row.measured_speedup - 1)
        padded_tps = predicted["padded"]["tokens_per_s"]
        packed_tps = predicted[row.collator]["tokens_per_s"]
        print(f"| {_short_source(row.source)} | {row.setting} | {row.collator} | "
              f"{row.measured_speedup:.2f}x | {speedup:.2f}x | {100 * speedup_error:+.1f}% | {naive:.2f}x | "
              f"{100 * (naive / row.measured_speedup - 1):+.1f}% | {_measured(row.padded_tokens_per_s)} / "
              f"{padded_tps:.0f} | {_measured(row.packed_tokens_per_s)} / {packed_tps:.0f} | "
              f"{'calibration' if row.calibrate else 'held out'} |")
    print()
    for calibrating, name in ((True, "calibration"), (False, "held out")):
        speedups, tokens, naives, in_range = groups[calibrating]
        print(f"{name} ({len(speedups)} rows): speedup {_stats(speedups)}, measured inside the predicted range "
              f"{sum(in_range)}/{len(in_range)}; tokens/s per GPU {_stats(tokens)}; naive slots-only speedup "
              f"{_stats(naives)}")
    residuals = sorted(math.log1p(error) for error in groups[True][0])
    print(f"calibration log(predicted/measured) speedup residuals: 10th {np.percentile(residuals, 10):+.3f}, "
          f"90th {np.percentile(residuals, 90):+.3f}")
    print("\nprofiles:")
    for name, lengths in PROFILES.items():
        array = np.asarray(lengths)
        print(f"  {name}: {len(array)} examples, mean {array.mean():.1f}, median {np.median(array):.0f}, "
              f"p99 {np.percentile(array, 99):.0f}, max {array.max()}")
    print("\nfound, not predicted:")
    for source, setting, why in NOT_MODELLED:
        print(f"  {source}: {setting} ({why})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibrate", action="store_true", help="refit the calibrated efficiencies first")
    args = parser.parse_args()
    efficiencies = CALIBRATED
    if args.calibrate:
        efficiencies = calibrate([row for row in ROWS if row.calibrate])
        print("calibrated:", ", ".join(f"{field}={getattr(efficiencies, field):.4g}"
                                       for field in CALIBRATED_FIELDS + EXPERT_FIELDS))
    report(efficiencies)


if __name__ == "__main__":
    main()
