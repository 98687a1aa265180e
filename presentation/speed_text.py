"""A plan's "how fast?" in words: the step-time model's prediction per collator (demo_core/throughput) as the CLI's
table and the page's sentence. No plotting library: the CLI prints a plan without one (its figure is speed_views.py's).

- `throughput_lines(throughput, gpus)`: the CLI's table, real tokens/s per GPU, seconds per step and speedup, and
  where a step's time goes;
- `throughput_markdown(throughput, gpus)`: the page's sentence and table.
"""

from __future__ import annotations

from demo_core import GPUS
from demo_core.throughput import PARTS, SHRINKS_WITH_PACKING

PART_WORDS = {"matmul": "matmuls", "attention": "attention", "ssm": "state-space scan", "memory_bound":
              "memory-bound ops", "dequantize": "4-bit dequantize", "host_overhead": "host (launches)",
              "sharded_comm": "weight gathers", "optimizer": "optimizer", "gradient_sync": "gradient all-reduce",
              "fixed": "fixed per step", "kernels": "kernel launches"}


def gpu_words(throughput: dict, gpus: int) -> str:
    label = GPUS[throughput["gpu"]].label
    return f"{gpus} x {label}" if gpus > 1 else label


def _speedup_text(entry: dict) -> str:
    low, high = entry["range"]
    speedup = entry["speedup_vs_padded"]
    return f"{speedup:.2f}×" if low == high else f"{speedup:.2f}× ({low:.2f}–{high:.2f}×)"


def throughput_lines(throughput: dict, gpus: int) -> list[str]:
    """The CLI's table of a plan's throughput."""
    lines = [f"how fast, predicted on {gpu_words(throughput, gpus)} (real tokens/s per GPU; docs/THROUGHPUT.md):",
             f"  {'collator':<18}{'tokens/s':>10}{'step s':>9}   speedup vs padded (range)"]
    for name, entry in throughput["collators"].items():
        lines.append(f"  {name:<18}{entry['tokens_per_s']:>10,.0f}{entry['step_s']:>9.3f}   {_speedup_text(entry)}")
    best = _best_packed(throughput)
    if best is not None:
        padded, packed = throughput["collators"]["padded"]["breakdown"], throughput["collators"][best]["breakdown"]
        lines.append(f"  where a step's time goes (s per step, padded / {best}; * packing cannot shrink it):")
        lines += [f"    {PART_WORDS[part]:<22}{padded[part]:>9.3f} / {packed[part]:.3f}"
                  + ("" if part in SHRINKS_WITH_PACKING else "  *") for part in PARTS if padded[part] or packed[part]]
    return lines


def _best_packed(throughput: dict) -> str | None:
    """The packed collator that keeps padded's batches (flatten), else the fastest other one."""
    names = [name for name in throughput["collators"] if name != "padded"]
    if "flatten" in names:
        return "flatten"
    return max(names, key=lambda name: throughput["collators"][name]["speedup_vs_padded"], default=None)


def throughput_markdown(throughput: dict, gpus: int) -> str:
    """The page's answer to "how fast?": a sentence, then one line per collator (a list, not a table: its four
    numbers wrap on a phone's column instead of squeezing a table's columns to letters)."""
    collators = throughput["collators"]
    best = _best_packed(throughput)
    lead = (f"**How fast on {gpu_words(throughput, gpus)}** (predicted; docs/THROUGHPUT.md has the model and its "
            f"error on published runs): ")
    if best is not None:
        lead += (f"{best} trains **{collators[best]['speedup_vs_padded']:.2f}×** padded's real tokens per second "
                 f"({collators[best]['tokens_per_s']:,.0f} vs {collators['padded']['tokens_per_s']:,.0f} per GPU).")
    rows = [f"- **{name}**: {entry['tokens_per_s']:,.0f} real tokens/s per GPU · {entry['step_s']:.3f} s per step · "
            f"{_speedup_text(entry)} padded's speed" for name, entry in collators.items()]
    return lead + "\n\n" + "\n".join(rows)
