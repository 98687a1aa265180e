"""A plan's "how fast?" shown: the step-time model's prediction per collator (demo_core/throughput) in words, as the
CLI's table, and as a figure of where each collator's time goes.

- `throughput_lines(throughput, gpus)`: the CLI's table, real tokens/s per GPU, seconds per step and speedup;
- `throughput_markdown(throughput, gpus)`: the page's sentence and table;
- `time_per_token_figure(throughput, ...)`: per collator, milliseconds per 1,000 real tokens by part (what packing
  shrinks drawn solid, what it cannot hatched), its speedup at the bar's end.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from demo_core import GPUS
from demo_core.throughput import PARTS, SHRINKS_WITH_PACKING
from presentation.figure_text import TITLE_CHARS_PER_IN, wrap_lines
from presentation.plots import FIGURE_DPI, RESULT_WIDTH_IN

PART_WORDS = {"matmul": "matmuls", "attention": "attention", "ssm": "state-space scan", "memory_bound":
              "memory-bound ops", "dequantize": "4-bit dequantize", "host_overhead": "host (launches)",
              "sharded_comm": "weight gathers", "optimizer": "optimizer", "gradient_sync": "gradient all-reduce",
              "fixed": "fixed per step", "kernels": "kernel launches"}
PART_COLORS = {"matmul": "#4e79a7", "attention": "#b07aa1", "ssm": "#9c755f", "memory_bound": "#edc948",
               "dequantize": "#ff9da7", "host_overhead": "#bab0ac", "sharded_comm": "#76b7b2", "optimizer": "#e15759",
               "gradient_sync": "#59a14f", "fixed": "#8c8c8c", "kernels": "#d4a6c8"}


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
    """The page's answer to "how fast?": a sentence and a table per collator."""
    collators = throughput["collators"]
    best = _best_packed(throughput)
    lead = (f"**How fast on {gpu_words(throughput, gpus)}** (predicted; docs/THROUGHPUT.md has the model and its "
            f"error on published runs): ")
    if best is not None:
        lead += (f"{best} trains **{collators[best]['speedup_vs_padded']:.2f}×** padded's real tokens per second "
                 f"({collators[best]['tokens_per_s']:,.0f} vs {collators['padded']['tokens_per_s']:,.0f} per GPU).")
    rows = ["| collator | real tokens/s per GPU | s per step | speedup vs padded |", "|---|---|---|---|"]
    rows += [f"| {name} | {entry['tokens_per_s']:,.0f} | {entry['step_s']:.3f} | {_speedup_text(entry)} |"
             for name, entry in collators.items()]
    return lead + "\n\n" + "\n".join(rows)


def time_per_token_figure(throughput: dict, gpus: int, width_in: float = RESULT_WIDTH_IN, *,
                          dpi: float = FIGURE_DPI) -> Figure:
    """Horizontal bars, one per collator: milliseconds per 1,000 real tokens on one GPU, stacked by part (hatched:
    the parts packing cannot shrink), the speedup over padded at each bar's end."""
    collators = throughput["collators"]
    names = list(collators)
    figure = Figure(figsize=(width_in, 1.6 + 0.42 * len(names)), dpi=dpi, layout="constrained")
    axes = figure.add_subplot()
    drawn = [part for part in PARTS if any(entry["breakdown"][part] for entry in collators.values())]
    ends = []
    for row, name in enumerate(names):
        entry = collators[name]
        tokens_per_step = entry["tokens_per_s"] * entry["step_s"]  # real tokens per GPU per step
        left = 0.0
        for part in drawn:
            width = entry["breakdown"][part] / tokens_per_step * 1e6
            axes.barh(row, width, left=left, color=PART_COLORS[part], edgecolor="white", linewidth=0.5, height=0.6,
                      hatch=None if part in SHRINKS_WITH_PACKING else "//")
            left += width
        ends.append(left)
    right = max(ends)
    for row, name in enumerate(names):
        axes.text(ends[row] + right * 0.02, row, f"{collators[name]['speedup_vs_padded']:.2f}×", va="center",
                  ha="left", fontsize=8)
    axes.set_xlim(0, right * 1.22)  # room for the speedups at the bars' ends
    axes.set_yticks(range(len(names)), names, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("ms per 1,000 real tokens on one GPU", fontsize=9)
    axes.tick_params(axis="x", labelsize=8)
    figure.legend(handles=[Patch(facecolor=PART_COLORS[part], hatch=None if part in SHRINKS_WITH_PACKING else "//",
                                 label=PART_WORDS[part]) for part in drawn],
                  fontsize=7, ncols=3 if width_in >= 5 else 2, loc="outside lower center", frameon=False)
    axes.set_title(wrap_lines(f"How fast on {gpu_words(throughput, gpus)}: where each collator's time goes "
                              f"(hatched: what packing cannot shrink)", int(width_in * TITLE_CHARS_PER_IN)),
                   fontsize=10)
    return figure
