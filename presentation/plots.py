"""Figures for the app, drawn from the engine's own numbers: `preview(config)` and the run document.

Plain `matplotlib.figure.Figure` objects, never pyplot: pyplot keeps every figure in a global registry until it is
closed, which leaks in a long-running server and is not thread-safe. A Figure made directly is freed when dropped.
Each takes the width in inches the page shows it at (a phone asks for narrower ones). The page's main figure, the
batch picture, has a module of its own (`batch_picture`).

- `lengths_figure(preview)`: the dataset's length histogram with its statistics.
- `throughput_figure(document)`, `loss_figure(document)`, `memory_figure(document)`: the results of a run.
- `anatomy_figure(document)`: where the profiled steps' time went (their median), per collator, by phase and by
  operation.
"""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from demo_core.anatomy import backward_over_forward
from demo_core.collators import BASELINE, collator_spec

# Each collator's colour and line style come from its registry entry (the same in every figure); the line styles
# differ so that identical curves (padded and flatten losses) stay visible on top of each other.
MB = 1e6  # memory is shown in MB (10^6 bytes), as the tables do
MEMORY_CATEGORY_COLORS = {"weights": "#4e79a7", "gradients": "#59a14f", "optimizer": "#e15759",
                          "activations": "#b07aa1", "temporary": "#edc948", "context": "#76b7b2"}
FIGURE_DPI = 80  # about the width the page gives a figure; more pixels only cost encoding time
# Widths of the figures shown beside another on a desktop page; a phone asks for narrower ones.
LENGTHS_WIDTH_IN, RESULT_WIDTH_IN = 7.5, 6.5
ANATOMY_WIDTH_IN = 9.5  # two panels side by side
TITLE_CHARS_PER_IN = 10  # characters per inch of width of a centred title at 10 pt


def wrap_lines(text: str, width: int) -> str:
    """Each line of `text` wrapped at `width` characters (the texts are written for a desktop's width)."""
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def _text_figure(message: str, width_in: float = 7.0, height_in: float = 3.0) -> Figure:
    """A figure that says why there is nothing to draw, instead of an empty frame."""
    figure = Figure(figsize=(width_in, height_in), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.axis("off")
    axes.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=11, color="#444444")
    return figure


# ----------------------------------------------------------------------------------------------------------------
# Dataset lengths
# ----------------------------------------------------------------------------------------------------------------


def lengths_figure(preview: dict, width_in: float = LENGTHS_WIDTH_IN) -> Figure:
    lengths = np.asarray(preview["lengths"])
    stats = preview["dataset_stats"]
    figure = Figure(figsize=(width_in, 4.2), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.hist(lengths, bins=min(50, max(10, len(lengths) // 5)), color="#4e79a7", alpha=0.85)
    for name, value, style in (("mean", stats["mean"], "-"), ("p50", stats["p50"], "--"),
                               ("p90", stats["p90"], "-."), ("p99", stats["p99"], ":")):
        axes.axvline(value, color="black", linestyle=style, linewidth=1, label=f"{name} {value:,.0f}")
    axes.set_xlabel("tokens per example")
    axes.set_ylabel("examples")
    axes.legend(fontsize=8, loc="upper right")
    summary = (f"{stats['count']} examples, {stats['total_tokens']:,} tokens\n"
               f"min {stats['min']}, max {stats['max']}, std {stats['std']:.0f}")
    if stats["truncated"]:
        summary += f"\n{stats['truncated']} cut to max length {preview['config']['max_length']}"
    axes.text(0.98, 0.55, summary, transform=axes.transAxes, ha="right", va="top", fontsize=8,
              bbox={"facecolor": "white", "edgecolor": "#cccccc"})
    _title(axes, f"{stats['name']}: example lengths. Padding pays for the longest example in every batch;\n"
                 f"the wider this spread, the more packing saves", width_in, 10)
    return figure


# ----------------------------------------------------------------------------------------------------------------
# Results of a run
# ----------------------------------------------------------------------------------------------------------------


def _title(axes, text: str, width_in: float, fontsize: float) -> None:
    """A title wrapped to the figure's width (the texts are written for a desktop's)."""
    axes.set_title(wrap_lines(text, int(width_in * TITLE_CHARS_PER_IN * 10 / fontsize)), fontsize=fontsize)


def _roomy(width_in: float, bars: int, label_in: float) -> bool:
    """Whether each collator's bars have room for a label `label_in` wide (a phone with seven collators has not)."""
    return width_in * 0.8 / bars >= label_in


def _result_label(result: dict) -> str:
    return result["collator"] + ("\n(partial)" if result.get("partial") else "")


def _collator_ticks(axes, positions: list[float], labels: list[str]) -> None:
    """Collator names under their bars; slanted once there are more than a figure's width holds side by side."""
    slanted = len(labels) > 4
    axes.set_xticks(positions, labels, fontsize=8.5 if slanted else 10, rotation=30 if slanted else 0,
                    ha="right" if slanted else "center", rotation_mode="anchor")


def throughput_figure(document: dict, width_in: float = RESULT_WIDTH_IN) -> Figure:
    """Median real tokens/s per collator with the middle half of its steps as a whisker; the slots ideal as a line
    and each collator's work ideal as a short dotted mark over its bar."""
    results = document["results"]
    if not results:
        return _text_figure("No collator has finished yet.", width_in)
    comparison = document["comparison"]
    figure = Figure(figsize=(width_in, 4.6), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    names = [result["collator"] for result in results]
    rates = [result["tokens_per_s"] or 0.0 for result in results]  # None: no timed step yet
    ranges = [result.get("tokens_per_s_range") or [rate, rate] for result, rate in zip(results, rates)]
    bars = axes.bar(range(len(results)), rates, color=[collator_spec(n).color for n in names],
                    hatch=["//" if r.get("partial") else "" for r in results], edgecolor="white",
                    yerr=np.array([[rate - low for rate, (low, _) in zip(rates, ranges)],
                                   [high - rate for rate, (_, high) in zip(rates, ranges)]]), ecolor="#555555",
                    capsize=4)
    padded = next((r for r in results if r["collator"] == BASELINE and r["tokens_per_s"]), None)
    roomy = _roomy(width_in, len(results), 0.8)
    for bar, result, (_, high) in zip(bars, results, ranges):
        entry = comparison[result["collator"]]
        speedup, center = entry["speedup_vs_padded"], bar.get_x() + bar.get_width() / 2
        text = ("no timed step" if result["tokens_per_s"] is None else f"{result['tokens_per_s']:,.0f} tok/s"
                if speedup is None else f"{speedup:.2f}×") + (" ⚠" if entry.get("flags") else "")
        axes.text(center, high * 1.01, text, ha="center", va="bottom", fontsize=11 if roomy else 8.5, fontweight="bold",
                  bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
        if roomy and result["samples_per_s"] is not None:  # else the results table has them
            axes.text(center, bar.get_height() / 2, f"{result['samples_per_s']:.1f}\nsamples/s", ha="center",
                      va="center", fontsize=8, color="white")
        work = entry.get("work_ideal_speedup")
        if padded is not None and work is not None and result is not padded:
            axes.hlines(padded["tokens_per_s"] * work, bar.get_x(), bar.get_x() + bar.get_width(), colors="black",
                        linestyles=":", linewidth=2)
            if roomy:  # over the bar's label, dark on white: readable whether or not the bar reaches its mark
                axes.annotate(f"work ideal {work:.2f}×", (center, high * 1.01), xytext=(0, 17),
                              textcoords="offset points", ha="center", va="bottom", fontsize=8, color="#333333")
    top = max(high for _, high in ranges) or 1.0
    if padded is not None:
        ideal = padded["tokens_per_s"] * document["ideal_speedup"]
        axes.axhline(ideal, color="black", linestyle="--", linewidth=1)
        axes.text(-0.4, ideal, f"ideal {document['ideal_speedup']:.2f}× = padded × slots / real tokens",
                  va="bottom", fontsize=8)
        top = max(top, ideal)
    axes.set_ylim(0, top * (1.3 if roomy else 1.18))  # room for the labels over the tallest bar
    _collator_ticks(axes, list(range(len(results))), [_result_label(r) for r in results])
    axes.set_ylabel("real tokens per second (padding not counted)")
    _title(axes, "Throughput on the same examples, same steps (trimmed mean of timed steps)\n(whisker: middle half "
                 "of steps; bar label: speedup over padded; ⚠: see the flags)", width_in, 10)
    return figure


def loss_figure(document: dict, width_in: float = RESULT_WIDTH_IN) -> Figure:
    results = document["results"]
    if not results:
        return _text_figure("No collator has finished yet.", width_in)
    # The legend goes under the axes, where seven collators' names do not cover the curves.
    columns = 2 if width_in >= RESULT_WIDTH_IN else 1
    figure = Figure(figsize=(width_in, 4.2 + 0.2 * -(-len(results) // columns)), dpi=FIGURE_DPI,
                    layout="constrained")
    axes = figure.add_subplot()
    for result in results:
        name = result["collator"]
        difference = document["comparison"][name]["max_abs_loss_diff_vs_padded"]
        baseline, spec = name == BASELINE, collator_spec(name)
        label = name if baseline or difference is None else f"{name} (max |Δ| vs padded {difference:.1e})"
        axes.plot(range(1, len(result["losses"]) + 1), result["losses"], color=spec.color, linestyle=spec.linestyle,
                  linewidth=2 if baseline else 1.6, marker="o" if baseline else None, markersize=3, label=label)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("training loss")
    # Identical curves span a tiny range; matplotlib would then label the axis "1e-7 + 5.93" instead of the loss.
    axes.ticklabel_format(axis="y", useOffset=False)
    axes.xaxis.get_major_locator().set_params(integer=True)
    figure.legend(fontsize=8, loc="outside lower center", ncols=columns, frameon=False)
    _title(axes, "Loss per step: correct packing trains exactly like padding\n"
                 "(naive concat differs: its examples see each other)", width_in, 10)
    return figure


def _memory_error_label(memory: dict) -> str:
    """The estimate's error over the categories that were measured, as the engine defines it: (est - meas) / meas.
    The asterisk points at the title, which names the categories left out."""
    measured = {category: value for category, value in (memory.get("measured") or {}).items() if value is not None}
    estimate = sum(memory.get("estimate", {}).get(category, 0) for category in measured)
    total = sum(measured.values())
    return f"est. {(estimate - total) / total:+.0%}*" if estimate and total else ""


def memory_figure(document: dict, width_in: float = RESULT_WIDTH_IN) -> Figure:
    """Per collator a pair of stacked bars: the estimate (hatched) and the measurement (solid)."""
    results = [result for result in document["results"] if (result.get("memory") or {}).get("estimate")]
    if not results:
        return _text_figure("Memory breakdown: not available for this run.\n"
                            "(The engine returned no per-category memory numbers.)", width_in, 4.6)
    figure = Figure(figsize=(width_in, 4.6), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    not_measured: set[str] = set()
    roomy = _roomy(width_in, len(results), 0.6)
    for index, result in enumerate(results):
        memory = result["memory"]
        top = 0.0
        for offset, categories, is_estimate in ((-0.2, memory["estimate"], True), (0.2, memory.get("measured"), False)):
            bottom = 0.0
            for category, color in MEMORY_CATEGORY_COLORS.items():
                value = (categories or {}).get(category)
                if value is None:
                    not_measured.add(category)
                    continue
                axes.bar(index + offset, value / MB, width=0.38, bottom=bottom, color=color, edgecolor="white",
                         hatch="//" if is_estimate else "", linewidth=0.5)
                bottom += value / MB
            top = max(top, bottom)
        measured_total = sum(v for v in (memory.get("measured") or {}).values() if v is not None) / MB
        axes.text(index, top, f"{measured_total:,.{1 if roomy else 0}f} MB\n{_memory_error_label(memory)}",
                  ha="center", va="bottom", fontsize=8 if roomy else 7)
    _collator_ticks(axes, list(range(len(results))), [_result_label(result) for result in results])
    axes.set_ylabel("MB at the peak of a step")
    handles = [Patch(color=color, label=category) for category, color in MEMORY_CATEGORY_COLORS.items()]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="//", label="estimate (left bar)"))
    figure.legend(handles=handles, fontsize=7.5, ncols=4 if width_in >= RESULT_WIDTH_IN else 2,
                  loc="outside lower center", frameon=False)
    note = (f"\n* error over the measured categories ({', '.join(sorted(not_measured))} not measurable here)"
            if not_measured else "")
    _title(axes, f"Memory at the peak of a training step, per category\n"
                 f"(left, hatched: estimate; right, solid: measured){note}", width_in, 9.5)
    axes.set_ylim(0, axes.get_ylim()[1] * 1.12)  # room for the labels above the tallest bar
    return figure


# Phases and operation classes of the time anatomy (anatomy.py), in stacking order, with their colours.
PHASE_COLORS = {"forward": "#4e79a7", "backward": "#f28e2b", "optimizer": "#e15759", "data": "#76b7b2",
                "other": "#bab0ac"}
OP_COLORS = {"matmul": "#4e79a7", "normalization": "#59a14f", "elementwise": "#edc948", "attention": "#b07aa1",
             "optimizer": "#e15759", "data": "#76b7b2", "other": "#bab0ac"}


def anatomy_figure(document: dict, width_in: float = ANATOMY_WIDTH_IN) -> Figure:
    """Stacked bars of the median profiled step per collator: by phase (with backward / forward) and by operation
    class, side by side on a desktop, one above the other on a phone."""
    profiled = [result for result in document["results"] if result.get("time_anatomy")]
    if not profiled:
        return _text_figure("Time anatomy: no step was profiled yet\n(step 2 of each burst is the first profiled one).",
                            min(width_in, RESULT_WIDTH_IN), 4.6)
    side_by_side = width_in >= RESULT_WIDTH_IN
    figure = Figure(figsize=(width_in, 4.6 if side_by_side else 8.4), dpi=FIGURE_DPI, layout="constrained")
    panels = figure.subplots(1, 2, sharey=True) if side_by_side else figure.subplots(2, 1)
    for axes, part, colors in zip(panels, ("phases", "ops"), (PHASE_COLORS, OP_COLORS)):
        for position, result in enumerate(profiled):
            anatomy, bottom = result["time_anatomy"], 0.0
            for name, color in colors.items():
                milliseconds = anatomy[part][name] * 1000
                axes.bar(position, milliseconds, bottom=bottom, color=color, edgecolor="white", linewidth=0.5,
                         label=name if position == 0 else None)
                bottom += milliseconds
            ratio = backward_over_forward(anatomy)
            label = (f"bwd/fwd {ratio:.1f}×" if part == "phases" and ratio is not None
                     else f"{anatomy['step_s'] * 1000:.0f} ms")
            axes.text(position, bottom, label, ha="center", va="bottom", fontsize=8)
        _collator_ticks(axes, list(range(len(profiled))), [_result_label(r) for r in profiled])
        axes.legend(fontsize=7, loc="upper right")
        axes.set_title("by phase" if part == "phases" else "by operation", fontsize=10)
        axes.set_ylabel("ms in the median profiled step")
        axes.set_ylim(0, axes.get_ylim()[1] * 1.3)  # room for the legend above the tallest bar
    figure.suptitle(wrap_lines("Where one training step's time goes (torch.profiler; the profiler slows the step, "
                               "compare shares)", int(width_in * TITLE_CHARS_PER_IN)), fontsize=10)
    return figure
