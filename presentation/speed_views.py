"""A plan's "how fast?" drawn: where each collator's time goes on the chosen GPU, a matplotlib `Figure` (never
pyplot). Its words are speed_text.py's.

- `time_per_token_figure(throughput, ...)`: per collator, milliseconds per 1,000 real tokens by part (what packing
  shrinks drawn solid, what it cannot hatched), its speedup at the bar's end.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from demo_core.throughput import PARTS, SHRINKS_WITH_PACKING
from presentation.figure_text import TITLE_CHARS_PER_IN, wrap_lines
from presentation.plots import FIGURE_DPI, RESULT_WIDTH_IN
from presentation.speed_text import PART_WORDS, gpu_words

PART_COLORS = {"matmul": "#4e79a7", "attention": "#b07aa1", "ssm": "#9c755f", "memory_bound": "#edc948",
               "dequantize": "#ff9da7", "host_overhead": "#bab0ac", "sharded_comm": "#76b7b2", "optimizer": "#e15759",
               "gradient_sync": "#59a14f", "fixed": "#8c8c8c", "kernels": "#d4a6c8"}


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
