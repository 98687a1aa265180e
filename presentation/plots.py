"""Figures for the app, drawn from the engine's own numbers: `preview(config)` and the run document.

Plain `matplotlib.figure.Figure` objects, never pyplot: pyplot keeps every figure in a global registry until it is
closed, which leaks in a long-running server and is not thread-safe. A Figure made directly is freed when dropped.
Each takes the width in inches the page shows it at (a phone asks for narrower ones). The page's main figure, the
batch picture, has a module of its own (`batch_picture`).

- `lengths_figure(preview)`: the dataset's length histogram with its statistics.
- `throughput_figure(document)`, `loss_figure(document)`, `memory_figure(document)`: the results of a run.
- `anatomy_figure(document)`: where the profiled steps' time went (their median), per collator, by phase and by
  operation.

Labels over bars are fitted to their bar's share of the width (figure_text.py): no text is drawn over another,
from a phone's width to a desktop's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from demo_core.collators import BASELINE, collator_spec
from demo_core.training.anatomy import backward_over_forward
from presentation.figure_text import (
    LINE_HEIGHT,
    TITLE_CHARS_PER_IN,
    BarLabel,
    axes_sizes_pt,
    stack_labels,
    text_width_pt,
    top_for,
    wrap_lines,
    wrapped_title,
)
from presentation.report import human_bytes

# Each collator's colour and line style come from its registry entry (the same in every figure); the line styles
# differ so that identical curves (padded and flatten losses) stay visible on top of each other.
MB = 1e6  # memory is shown in MB (10^6 bytes), as the tables do
MEMORY_CATEGORY_COLORS = {"weights": "#4e79a7", "gradients": "#59a14f", "optimizer": "#e15759",
                          "activations": "#b07aa1", "temporary": "#edc948", "context": "#76b7b2",
                          # a CUDA peak's bytes beyond weights and optimizer state, which the allocator does not split
                          "other": "#bab0ac"}
# CSS pixels per inch a figure is shown at: the page asks for a figure `width_in` = its CSS width / FIGURE_DPI and
# draws it at FIGURE_DPI x the screen's device pixels per CSS pixel (`dpi`, serving.page.Screen), sharp on a phone.
FIGURE_DPI = 80
# Widths of the figures shown beside another on a desktop page; a phone asks for narrower ones.
LENGTHS_WIDTH_IN, RESULT_WIDTH_IN = 7.5, 6.5
ANATOMY_WIDTH_IN = 9.5  # two panels side by side
Y_AXIS_IN = 0.9  # the y axis' label and tick labels, left of the axes


def _text_figure(message: str, width_in: float = 7.0, height_in: float = 3.0, *,
                 dpi: float = FIGURE_DPI) -> Figure:
    """A figure that says why there is nothing to draw, instead of an empty frame."""
    figure = Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")
    axes = figure.add_subplot()
    axes.axis("off")
    axes.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=11, color="#444444")
    return figure


# ----------------------------------------------------------------------------------------------------------------
# Dataset lengths
# ----------------------------------------------------------------------------------------------------------------


def lengths_figure(preview: dict, width_in: float = LENGTHS_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    lengths = np.asarray(preview["lengths"])
    stats = preview["dataset_stats"]
    figure = Figure(figsize=(width_in, 4.2), dpi=dpi, layout="constrained")
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
    wrapped_title(axes, f"{stats['name']}: example lengths. Padding pays for the longest example in every batch;\n"
                 f"the wider this spread, the more packing saves", width_in, 10)
    return figure


# ----------------------------------------------------------------------------------------------------------------
# Results of a run
# ----------------------------------------------------------------------------------------------------------------


def _result_label(result: dict) -> str:
    return result["collator"] + ("\n(partial)" if result.get("partial") else "")


def _collator_ticks(axes, labels: list[str], axes_in: float) -> None:
    """Collator names under their bars, slanted once they are wider than a bar's share of `axes_in` (the axes' width,
    about: the figure's or panel's less the y axis); a slanted name is one line (two would lean on the next)."""
    share_pt = axes_in * 72 / (len(labels) + 0.2) - 4  # matplotlib pads the bars' span by 0.1 bar each side
    slanted = any(text_width_pt(line, 10, False) > share_pt for label in labels for line in label.split("\n"))
    axes.set_xticks(range(len(labels)), [label.replace("\n", " ") for label in labels] if slanted else labels,
                    fontsize=8.5 if slanted else 10, rotation=30 if slanted else 0, ha="right" if slanted else "center",
                    rotation_mode="anchor")




# ---- throughput, loss and memory ---------------------------------------------------------------------------------


def _throughput_bars(axes, results: list[dict]) -> tuple[list, list[list[float]]]:
    """Median real tokens/s per collator with the middle half of its steps as a whisker (no timed step yet: 0); the
    bars and each one's whisker (low, high)."""
    names = [result["collator"] for result in results]
    rates = [result["tokens_per_s"] or 0.0 for result in results]
    ranges = [result.get("tokens_per_s_range") or [rate, rate] for result, rate in zip(results, rates)]
    bars = axes.bar(range(len(results)), rates, color=[collator_spec(n).color for n in names],
                    hatch=["//" if r.get("partial") else "" for r in results], edgecolor="white",
                    # The bar is the trimmed mean, which on a few unequal steps can lie outside their middle half
                    # (demo_core/results.py): the whisker then starts at the bar, never below it
                    yerr=np.array([[max(rate - low, 0.0) for rate, (low, _) in zip(rates, ranges)],
                                   [max(high - rate, 0.0) for rate, (_, high) in zip(rates, ranges)]]),
                    ecolor="#555555",
                    capsize=4)
    return list(bars), ranges


def _speedup_labels(result: dict, entry: dict, fontsize: float) -> list[BarLabel]:
    """Over a bar: its speedup over padded (bold), then its work ideal, which is left out first when narrow."""
    speedup, work = entry["speedup_vs_padded"], entry.get("work_ideal_speedup")
    warning = " ⚠" if entry.get("flags") else ""
    if result["tokens_per_s"] is None:
        main = BarLabel(("no timed step",), fontsize, max_lines=3)
    else:
        main = BarLabel((f"{result['tokens_per_s']:,.0f} tok/s{warning}",) if speedup is None
                        else (f"{speedup:.2f}×{warning}", f"{speedup:.1f}×{warning}"), fontsize, bold=True)
    if result["collator"] == BASELINE or work is None:
        return [main]
    return [main, BarLabel((f"work ideal {work:.2f}×",), 8, color="#333333", optional=True)]


def _samples_inside(axes, bars: list, results: list[dict], unit_pt: float, height_pt: float) -> None:
    """Each bar's samples/s written inside it, white, where the bar is wide and tall enough (else the results table
    has them)."""
    points_per_unit = height_pt / axes.get_ylim()[1]
    for bar, result in zip(bars, results):
        if result["samples_per_s"] is None:
            continue
        text = f"{result['samples_per_s']:.1f}\nsamples/s"
        wide = max(text_width_pt(line, 8, False) for line in text.split("\n")) <= bar.get_width() * unit_pt - 4
        if wide and bar.get_height() * points_per_unit >= 3 * 8 * LINE_HEIGHT:
            axes.text(bar.get_x() + bar.get_width() / 2, bar.get_height() / 2, text, ha="center", va="center",
                      fontsize=8, color="white")


def _ideal_lines(axes, bars: list, results: list[dict], document: dict) -> tuple[list, float, list[float]]:
    """The slots ideal as a dashed line across and each collator's work ideal as a dotted mark over its bar, both
    relative to padded: their legend entries, the line's height, and each bar's mark height (0: none)."""
    padded = next((r for r in results if r["collator"] == BASELINE and r["tokens_per_s"]), None)
    if padded is None:
        return [], 0.0, [0.0] * len(results)
    ideal = padded["tokens_per_s"] * document["ideal_speedup"]
    axes.axhline(ideal, color="black", linestyle="--", linewidth=1)
    marks = []
    for bar, result in zip(bars, results):
        work = document["comparison"][result["collator"]].get("work_ideal_speedup")
        marks.append(padded["tokens_per_s"] * work if work is not None and result is not padded else 0.0)
        if marks[-1]:
            axes.hlines(marks[-1], bar.get_x(), bar.get_x() + bar.get_width(), colors="black", linestyles=":",
                        linewidth=2)
    handles = [Line2D([], [], color="black", linestyle="--", linewidth=1,
                      label=f"ideal {document['ideal_speedup']:.2f}× = padded × slots / real tokens"),
               Line2D([], [], color="black", linestyle=":", linewidth=2,
                      label="work ideal = padded's FLOPs / its FLOPs per real token")]
    return handles, ideal, marks


def throughput_figure(document: dict, width_in: float = RESULT_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    """Median real tokens/s per collator with the middle half of its steps as a whisker; the slots ideal as a dashed
    line named in the legend under the axes (where no bar label can be), each collator's work ideal as a short
    dotted mark over its bar, its labels over both."""
    results = document["results"]
    if not results:
        return _text_figure("No collator has finished yet.", width_in, dpi=dpi)
    figure = Figure(figsize=(width_in, 4.6), dpi=dpi, layout="constrained")
    axes = figure.add_subplot()
    bars, ranges = _throughput_bars(axes, results)
    handles, ideal, marks = _ideal_lines(axes, bars, results, document)
    _collator_ticks(axes, [_result_label(r) for r in results], width_in - Y_AXIS_IN)
    axes.set_ylabel("real tokens per second (padding not counted)")
    if handles:
        figure.legend(handles=handles, fontsize=8, loc="outside lower center", frameon=False)
    wrapped_title(axes, "Throughput on the same examples, same steps (trimmed mean of timed steps)\n(whisker: middle half "
                 "of steps; bar label: speedup over padded; ⚠: see the flags)", width_in, 10)
    [(unit_pt, height_pt)] = axes_sizes_pt(figure)
    fontsize = 11 if unit_pt >= 60 else 8.5
    stacks = []
    for bar, result, (_, high), mark in zip(bars, results, ranges, marks):
        # Over the whisker and the dotted mark, so that the labels' white boxes hide neither.
        labels = _speedup_labels(result, document["comparison"][result["collator"]], fontsize)
        stacks.append((max(high, mark), stack_labels(axes, bar.get_x() + bar.get_width() / 2, max(high, mark),
                                                      labels, unit_pt - 4)))
    axes.set_ylim(0, top_for(stacks, height_pt, floor=ideal * 1.03))  # the dashed line clear of the frame
    _samples_inside(axes, bars, results, unit_pt, height_pt)
    return figure


def loss_figure(document: dict, width_in: float = RESULT_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    results = document["results"]
    if not results:
        return _text_figure("No collator has finished yet.", width_in, dpi=dpi)
    # The legend goes under the axes, where seven collators' names do not cover the curves.
    columns = 2 if width_in >= RESULT_WIDTH_IN else 1
    figure = Figure(figsize=(width_in, 4.2 + 0.2 * -(-len(results) // columns)), dpi=dpi,
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
    wrapped_title(axes, "Loss per step: correct packing trains exactly like padding\n"
                 "(naive concat differs: its examples see each other)", width_in, 10)
    return figure


@dataclasses.dataclass(frozen=True)
class MemoryBars:
    """One collator's pair of bars: what the estimate and the measurement stack, the measured label and the
    estimate's error."""

    estimate: dict[str, int]
    measured: dict[str, int]
    measured_label: str
    error_label: str  # empty when there is nothing to compare

    @property
    def top(self) -> float:
        return max(sum(self.estimate.values()), sum(self.measured.values())) / MB

    def labels(self, fontsize: float) -> list[BarLabel]:
        """Over the pair: the measured peak (bold), then the estimate's error, left out first when narrow."""
        error = [BarLabel((self.error_label,), fontsize, max_lines=1, optional=True)] if self.error_label else []
        return [BarLabel((self.measured_label,), fontsize, bold=True), *error]


def _memory_bars(memory: dict) -> MemoryBars:
    """What was alive at the moment both sides are compared at (`compared_moment`: on a CPU the end of the forward,
    on CUDA the step's peak), labelled with the peak the results table shows (`peak_bytes` is the result's
    `peak_memory_bytes`). A document saved before `compared_moment` stacks the estimate at its own peak."""
    estimate = memory.get("estimated_at_compared") or memory["estimated_at_peak"]
    peak, estimated = memory.get("peak_bytes"), sum(estimate.values())
    error = f"est. {(estimated - peak) / peak:+.0%}" if peak and estimated else ""
    return MemoryBars(estimate, memory["measured_at_peak"] if peak else {},
                      human_bytes(peak) if peak else "not measured", error)


def _saved_memory_bars(memory: dict) -> MemoryBars:
    """A document saved before results had one peak: every category side by side, the measured ones summed, the
    error over them only (the asterisk points at the title's note on the categories left out)."""
    measured = {category: value for category, value in (memory.get("measured") or {}).items() if value is not None}
    estimate, total = sum(memory["estimate"].get(category, 0) for category in measured), sum(measured.values())
    return MemoryBars(memory["estimate"], measured, f"{total / MB:,.1f} MB",
                      f"est. {(estimate - total) / total:+.0%}*" if estimate and total else "")


def _memory_stacks(axes, pairs: list[MemoryBars]) -> set[str]:
    """The stacked bars, estimate (hatched) left of measured (solid) at each collator's tick; the categories drawn."""
    drawn: set[str] = set()
    for index, pair in enumerate(pairs):
        for offset, categories, hatch in ((-0.2, pair.estimate, "//"), (0.2, pair.measured, "")):
            bottom = 0.0
            for category, color in MEMORY_CATEGORY_COLORS.items():
                value = categories.get(category) or 0
                if value:  # a category not alive at the peak (or not measured) has no segment
                    axes.bar(index + offset, value / MB, width=0.38, bottom=bottom, color=color, edgecolor="white",
                             hatch=hatch, linewidth=0.5)
                    bottom += value / MB
                    drawn.add(category)
    return drawn


# A result's `compared_moment` (demo_core/memory/measure.py), in the chart's title.
MOMENT_WORDS = {"forward_end": "the end of a training step's forward", "peak": "the peak of a training step"}


def _memory_words(results: list[dict], at_peak: bool) -> tuple[str, str]:
    """The title, and the words under the collators: what the measurement is on this device."""
    if not at_peak:
        not_measured = sorted({category for result in results
                               for category, value in (result["memory"].get("measured") or {}).items()
                               if value is None})
        note = (f"\n* error over the measured categories ({', '.join(not_measured)} not measurable here)"
                if not_measured else "")
        return f"Memory at a training step, per category\n(left, hatched: estimate; right, solid: measured){note}", ""
    kind = results[0]["memory"].get("peak_kind")
    words = f"measured: {_what_it_is(kind)}" if kind else ""
    compared = {result["memory"].get("compared_moment") for result in results}
    if len(compared) == 1 and None not in compared:
        moment = compared.pop()
        return (f"Memory alive at {MOMENT_WORDS.get(moment, moment)}, per category: the estimate (left, hatched) and "
                f"the measurement (right, solid) at the same moment; label: the measured bytes", words)
    moments = {(result["memory"].get("estimated_peak_moment"), result["memory"].get("peak_moment"))
               for result in results}
    # The moments are the same for every collator of a run; were they not, the title could name none of them.
    estimated, measured = moments.pop() if len(moments) == 1 else (None, None)
    estimated_at, measured_at = (f" at {moment}" if moment else "" for moment in (estimated, measured))
    return (f"Memory alive at the peak of a training step, per category\n(left, hatched: estimate{estimated_at}; "
            f"right, solid: measured{measured_at}; label: the measured peak)", words)


def _what_it_is(peak_kind: str) -> str:
    """A peak kind's first words, what the measured bar is ("sum of live tensor sizes at the end of the forward",
    "allocator peak"); the rest of memory_measure.PEAK_KINDS' sentence is in the headline under the run's numbers."""
    return peak_kind.split(" (")[0].split(": ")[0]


def memory_figure(document: dict, width_in: float = RESULT_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    """Per collator a pair of stacked bars, the estimate (hatched) and the measurement (solid), what each says was
    alive at one moment of the step (the title names it), labelled with the measured peak, the number the results
    table shows."""
    results = [result for result in document["results"] if (result.get("memory") or {}).get("estimate")]
    if not results:
        return _text_figure("Memory breakdown: not available for this run.\n"
                            "(The engine returned no per-category memory numbers.)", width_in, 4.6, dpi=dpi)
    at_peak = all("measured_at_peak" in result["memory"] for result in results)
    pairs = [(_memory_bars if at_peak else _saved_memory_bars)(result["memory"]) for result in results]
    title, words = _memory_words(results, at_peak)
    words = wrap_lines(words, int(width_in * TITLE_CHARS_PER_IN * 10 / 8))
    figure = Figure(figsize=(width_in, 4.6 + 0.15 * (words.count("\n") + 1) * bool(words)), dpi=dpi,
                    layout="constrained")
    axes = figure.add_subplot()
    drawn = _memory_stacks(axes, pairs)
    _collator_ticks(axes, [_result_label(result) for result in results], width_in - Y_AXIS_IN)
    axes.set_xlabel(words, fontsize=8)
    axes.set_ylabel("MB alive at that moment")
    handles = [Patch(color=color, label=category) for category, color in MEMORY_CATEGORY_COLORS.items()
               if category in drawn]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="//", label="estimate (left bar)"))
    figure.legend(handles=handles, fontsize=7.5, ncols=4 if width_in >= RESULT_WIDTH_IN else 3 if width_in >= 4 else 2,
                  loc="outside lower center", frameon=False)
    wrapped_title(axes, title, width_in, 9.5)
    [(unit_pt, height_pt)] = axes_sizes_pt(figure)
    fontsize = 8 if unit_pt >= 60 else 7
    stacks = [(pair.top, stack_labels(axes, index, pair.top, pair.labels(fontsize), unit_pt - 4))
              for index, pair in enumerate(pairs)]
    axes.set_ylim(0, top_for(stacks, height_pt))
    return figure


# Phases and operation classes of the time anatomy (anatomy.py), in stacking order, with their colours.
PHASE_COLORS = {"forward": "#4e79a7", "backward": "#f28e2b", "optimizer": "#e15759", "data": "#76b7b2",
                "other": "#bab0ac"}
OP_COLORS = {"matmul": "#4e79a7", "normalization": "#59a14f", "elementwise": "#edc948", "attention": "#b07aa1",
             "optimizer": "#e15759", "data": "#76b7b2", "other": "#bab0ac"}


# Each panel's part of an anatomy (anatomy.py): its colours and its title.
ANATOMY_PANELS = {"phases": (PHASE_COLORS, "by phase (over each bar: bwd/fwd, backward time / forward time)"),
                  "ops": (OP_COLORS, "by operation (over each bar: the step's time)")}
ANATOMY_PANEL_MIN_IN = 4.5  # narrower, seven collators' bars leave no room for their labels: one panel above the other


def _anatomy_label(anatomy: dict, part: str) -> BarLabel:
    """Over a bar: backward / forward on the phase panel (the number alone when narrow), the step's time on the
    other."""
    ratio = backward_over_forward(anatomy)
    if part == "phases" and ratio is not None:
        return BarLabel((f"bwd/fwd {ratio:.1f}×", f"{ratio:.1f}×"), max_lines=1)
    return BarLabel((f"{anatomy['step_s'] * 1000:.0f} ms",))


def _anatomy_panel(panel, profiled: list[dict], part: str, title: str, panel_in: float):
    """One panel's axes, `panel_in` wide: each collator's median profiled step stacked by `part`, its legend under the
    panel, where it covers no bar."""
    axes = panel.add_subplot()
    for position, result in enumerate(profiled):
        bottom = 0.0
        for name, color in ANATOMY_PANELS[part][0].items():
            milliseconds = result["time_anatomy"][part][name] * 1000
            axes.bar(position, milliseconds, bottom=bottom, color=color, edgecolor="white", linewidth=0.5,
                     label=name if position == 0 else None)
            bottom += milliseconds
    _collator_ticks(axes, [_result_label(r) for r in profiled], panel_in - Y_AXIS_IN)
    panel.legend(fontsize=7, ncols=max(2, int(panel_in / 1.2)), loc="outside lower center", frameon=False)
    axes.set_title(wrap_lines(title, int(panel_in * TITLE_CHARS_PER_IN * 10 / 9)), fontsize=9)
    axes.set_ylabel("ms in the median profiled step")
    return axes


def anatomy_figure(document: dict, width_in: float = ANATOMY_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    """Stacked bars of the median profiled step per collator: by phase (with backward / forward) and by operation
    class, side by side on a wide page, one above the other on a narrower one, on one scale (the same steps)."""
    profiled = [result for result in document["results"] if result.get("time_anatomy")]
    if not profiled:
        return _text_figure("Time anatomy: no step was profiled yet\n(step 2 of each burst is the first profiled one).",
                            min(width_in, RESULT_WIDTH_IN), 4.6, dpi=dpi)
    side_by_side = width_in >= 2 * ANATOMY_PANEL_MIN_IN
    figure = Figure(figsize=(width_in, 5.0 if side_by_side else 9.0), dpi=dpi, layout="constrained")
    # A panel each (subfigures), so that each legend goes under its own panel: their colours mean different things.
    panels = figure.subfigures(1, 2) if side_by_side else figure.subfigures(2, 1)
    panel_in = width_in / 2 if side_by_side else width_in
    parts = [(part, _anatomy_panel(panel, profiled, part, title, panel_in))
             for panel, (part, (_, title)) in zip(panels, ANATOMY_PANELS.items())]
    figure.suptitle(wrap_lines("Where one training step's time goes (torch.profiler; the profiler slows the step, "
                               "compare shares)", int(width_in * TITLE_CHARS_PER_IN)), fontsize=10)
    tops = []
    for (part, axes), (unit_pt, height_pt) in zip(parts, axes_sizes_pt(figure)):
        stacks = []
        for position, result in enumerate(profiled):
            total = sum(result["time_anatomy"][part].values()) * 1000
            label = _anatomy_label(result["time_anatomy"], part)
            stacks.append((total, stack_labels(axes, position, total, [label], unit_pt - 4)))
        tops.append(top_for(stacks, height_pt))
    for _, axes in parts:
        axes.set_ylim(0, max(tops))
    return figure
