"""The GPU check's report: one markdown file from the llama-1b JSON documents that benchmarks/gpu_check.sh wrote.

- throughput: tokens/s, speedup vs padded against the ideal (padded slots / real tokens), peak memory
  (`max_memory_allocated`) vs padded, max |Δloss| vs padded, with the paper's aims (varlen: ≥ 2.0x and ≥ 20% less
  peak memory on flan-like, ≥ 1.4x and ≥ 6% on orcamath-like);
- memory: estimate vs measurement per category and for the step's peak (aims: total ±5%, activations ±10%);
- the CUDA context NVML measured, next to the 1,343 MB the seed saw on a V100 (CUDA 11, before lazy loading);
- the time anatomy of each burst's profiled step (phases, backward / forward, matmul share of CUDA kernel time).
Exits 1 when packing's losses leave padding's, or when an anatomy's phases do not add up to its step within 15% or
caught no matmul kernel (the checks that must hold; missed aims are reported, not failed).

    python benchmarks/gpu_report.py OUT_DIR      # reads OUT_DIR/llama-1b-*.json, writes OUT_DIR/gpu_check.md
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# bf16 autocast: padded and packed rows run the same attention kernel on the same segments, but the GEMMs see other
# shapes (B x L vs 1 x T), so their sums round differently; measured differences are ~1e-3 on small models.
LOSS_TOLERANCE = 2e-2
AIMS = {("flan-like", "varlen"): (2.0, -0.20), ("orcamath-like", "varlen"): (1.4, -0.06)}
SEED_CONTEXT_BYTES = 1_343 * 2**20
CATEGORIES = ("weights", "gradients", "optimizer", "activations", "context")


def _gb(value) -> str:
    return "–" if value is None else f"{value / 1e9:.2f}"


def _percent(value) -> str:
    return "–" if value is None else f"{value:+.1%}"


def _number(value, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def report(documents: list[dict]) -> tuple[str, list[str]]:
    """(markdown, failures)."""
    environment = documents[0]["environment"]
    lines = [f"{time.strftime('%Y-%m-%d')}, {environment.get('gpu', '?')}, torch {environment['torch']}, "
             f"transformers {environment['transformers']}, Python {environment['python']}; llama-1b (Llama-3.2-1B "
             f"shape, random init), bf16 autocast, AdamW", "",
             "| dataset | attention | collator | tokens/s | step ms | speedup | ideal | of ideal | work ideal | flags "
             "| peak GB | peak vs padded | max \\|Δloss\\| | aim |", "|" + "---|" * 14]
    failures, memory_rows, contexts, anatomy_rows = [], [], [], []
    for document in documents:
        dataset, attention = document["dataset_stats"]["name"], document["config"]["resolved_attention"]
        for result in document["results"]:
            entry = document["comparison"][result["collator"]]
            speedup, ideal = entry["speedup_vs_padded"], entry["ideal_speedup"]
            peak_change, loss_diff = entry.get("peak_memory_vs_padded"), entry["max_abs_loss_diff_vs_padded"]
            aim = "–"
            if result["collator"] != "padded" and (dataset, attention) in AIMS:
                speed_aim, memory_aim = AIMS[dataset, attention]
                met = (speedup or 0) >= speed_aim and peak_change is not None and peak_change <= memory_aim
                aim = f"{'met' if met else 'missed'} (≥ {speed_aim}x, ≤ {memory_aim:+.0%})"
            if loss_diff is not None and loss_diff > LOSS_TOLERANCE:
                failures.append(f"{dataset} {attention} {result['collator']}: packed losses left padded ones, "
                                f"max |Δloss| {loss_diff:.1e}")
            lines.append(
                f"| {dataset} | {attention} | {result['collator']} | {result['tokens_per_s']:.0f} | "
                f"{1000 * result['step_time_median_s']:.0f} | {_number(speedup, '.2f', 'x')} | {ideal:.2f}x | "
                f"{_number(entry['ratio_to_ideal'], '.0%')} | {_number(entry.get('work_ideal_speedup'), '.2f', 'x')} | "
                f"{', '.join(entry.get('flags', [])) or '–'} | {_gb(result['peak_memory_bytes'])} | "
                f"{_percent(peak_change)} | {_number(loss_diff, '.1e')} | {aim} |")
            memory = result["memory"]
            peak, estimated_peak = result["peak_memory_bytes"], memory.get("estimated_peak_bytes")
            cells = [f"{_gb(memory['estimate'][c])} / {_gb(memory['measured'][c])} ({_percent(memory['error'][c])})"
                     for c in CATEGORIES]
            total_error = None if not (peak and estimated_peak) else estimated_peak / peak - 1
            memory_rows.append(f"| {dataset} | {attention} | {result['collator']} | " + " | ".join(cells)
                               + f" | {_gb(estimated_peak)} / {_gb(peak)} ({_percent(total_error)}) |")
            if memory["measured"].get("context"):
                contexts.append(memory["measured"]["context"])
            anatomy_rows.append(_anatomy_row(dataset, attention, result, failures))
    lines += ["", "Memory, estimate / measured GB (error), per category and for the step's peak "
              "(`max_memory_allocated`); aims: total ±5%, activations ±10%:", "",
              "| dataset | attention | collator | " + " | ".join(CATEGORIES) + " | peak |", "|" + "---|" * 9]
    lines += memory_rows
    context = (f"{min(contexts) / 2**20:,.0f}–{max(contexts) / 2**20:,.0f} MB" if contexts else "not measured "
               "(NVML unavailable)")
    lines += ["", f"CUDA context (NVML process used − allocator reserved): {context}; the seed measured "
              f"{SEED_CONTEXT_BYTES / 2**20:,.0f} MB on a V100 (CUDA 11, before lazy loading)."]
    lines += ["", "Time anatomy of the profiled step (ms): phases, backward / forward, matmul share of the step:", "",
              "| dataset | attention | collator | step | forward | backward | optimizer | data | other | bwd/fwd | "
              "matmul share | phases / step |", "|" + "---|" * 12]
    lines += anatomy_rows
    return "\n".join(lines) + "\n", failures


ANATOMY_PHASES = ("forward", "backward", "optimizer", "data", "other")


def _anatomy_row(dataset: str, attention: str, result: dict, failures: list[str]) -> str:
    """One row of the anatomy table; an anatomy whose phases miss its step by > 15%, or that caught no matmul
    kernel (the CUDA activity was not recorded), is a failure."""
    where = f"{dataset} {attention} {result['collator']}"
    anatomy = result.get("time_anatomy")
    if not anatomy:
        failures.append(f"{where}: no time anatomy")
        return f"| {dataset} | {attention} | {result['collator']} |" + " – |" * 9
    step_s, phases, ops = anatomy["step_s"], anatomy["phases"], anatomy["ops"]
    phase_share = sum(phases.values()) / step_s
    if not 0.85 <= phase_share <= 1.15 or not ops.get("matmul"):
        failures.append(f"{where}: anatomy phases {phase_share:.2f} of the step, matmul {ops.get('matmul')} s")
    backward_per_forward = phases["backward"] / phases["forward"] if phases.get("forward") else None
    cells = [f"{1000 * step_s:.0f}", *(f"{1000 * phases.get(name, 0.0):.0f}" for name in ANATOMY_PHASES),
             _number(backward_per_forward, ".2f"), f"{ops.get('matmul', 0.0) / step_s:.0%}", f"{phase_share:.2f}"]
    return f"| {dataset} | {attention} | {result['collator']} | " + " | ".join(cells) + " |"


def main() -> int:
    out = Path(sys.argv[1])
    documents = [json.loads(path.read_text()) for path in sorted(out.glob("llama-1b-*.json"))]
    if not documents:
        print(f"no llama-1b-*.json in {out}", file=sys.stderr)
        return 1
    markdown, failures = report(documents)
    (out / "gpu_check.md").write_text(markdown)
    print(markdown)
    for failure in failures:
        print(f"FAILED: {failure} (losses: tolerance {LOSS_TOLERANCE:.0e})", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
