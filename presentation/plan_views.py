"""A memory plan (demo_core's planner) drawn: its two figures, matplotlib `Figure` objects, never pyplot (a long-running
server must not keep them in a registry). Its words are plan_text.py's.

- `bars_figure(padded, packed, ...)`: what is alive at each layout's peak, stacked by category, GPU sizes across;
- `scaling_figure(plan)`: the peak against the sequence length, padded and packed.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from demo_core import GIB, DeviceEstimate, Plan
from demo_core import MEMORY_CATEGORIES as CATEGORIES
from presentation.figure_text import TITLE_CHARS_PER_IN, BarLabel, axes_sizes_pt, stack_labels, top_for, wrap_lines
from presentation.plots import FIGURE_DPI, MEMORY_CATEGORY_COLORS, RESULT_WIDTH_IN

GPU_LINE_COLORS = {24: "#59a14f", 40: "#f28e2b", 80: "#e15759", 141: "#7a0019"}


def _gpu_lines(axes) -> None:
    """Dashed lines at the common GPU sizes that fall inside the axes, labelled on the right."""
    for gb, color in GPU_LINE_COLORS.items():
        if gb <= axes.get_ylim()[1]:
            axes.axhline(gb, color=color, linestyle="--", linewidth=1)
            axes.text(axes.get_xlim()[1], gb, f" {gb} GB", color=color, va="center", ha="left", fontsize=8)


def _live_stack(axes, position: int, device: DeviceEstimate) -> float:
    """What is alive at the estimate's peak stacked by category at `position`, and the card's use as a black mark over
    it (what the fit is decided on); the taller of the two, in GiB."""
    bottom = 0.0
    for category in CATEGORIES:
        value = device.live_by_moment[device.peak_moment].get(category, 0) / GIB
        axes.bar(position, value, bottom=bottom, color=MEMORY_CATEGORY_COLORS[category], edgecolor="white",
                 linewidth=0.5, width=0.55)
        bottom += value
    used = device.memory.device_used.bytes / GIB
    axes.hlines(used, position - 0.3, position + 0.3, colors="black", linewidth=1.5)
    return max(bottom, used)


def _peak_labels(device: DeviceEstimate, chosen: bool) -> list[BarLabel]:
    """Over a bar, from the bottom up: the card's use (the black mark), then the live tensors at their peak moment;
    bold for the layout asked."""
    live = sum(device.live_by_moment[device.peak_moment].values()) / GIB
    return [BarLabel((f"{device.memory.device_used.bytes / GIB:,.1f} GiB on the card",), bold=chosen),
            BarLabel((f"{live:,.1f} GiB live at {device.peak_moment}",), bold=chosen, max_lines=3)]


def bars_figure(padded: DeviceEstimate, packed: DeviceEstimate, chosen_packed: bool,
                width_in: float = RESULT_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    """What is alive at each estimate's peak, stacked by category, with the common GPU sizes drawn across."""
    figure = Figure(figsize=(width_in, 4.6), dpi=dpi, layout="constrained")
    axes = figure.add_subplot()
    tops = [_live_stack(axes, position, device) for position, device in enumerate((padded, packed))]
    axes.set_xticks([0, 1], ["padded", "packed (padding-free)"])
    axes.set_xlim(-0.6, 1.6)
    axes.set_ylabel("GiB per device at the peak of a step")
    # Under the axes, where it covers no bar; the context is not a tensor: it is in the black mark.
    figure.legend(handles=[Patch(color=MEMORY_CATEGORY_COLORS[c], label=c) for c in CATEGORIES if c != "context"],
                  fontsize=7, ncols=3, loc="outside lower center", frameon=False)
    axes.set_title(wrap_lines("Will it fit? Memory alive at the peak, per category\n(black mark: used on the card, "
                              "with allocator cache and CUDA context; dashed: common GPU sizes)",
                              int(width_in * TITLE_CHARS_PER_IN)), fontsize=10)
    [(unit_pt, height_pt)] = axes_sizes_pt(figure)
    stacks = [(top, stack_labels(axes, position, top, _peak_labels(device, (position == 1) == chosen_packed),
                                 unit_pt - 4))
              for position, (top, device) in enumerate(zip(tops, (padded, packed)))]
    # Room for the 24 GB line once a plan is a quarter of it; a toy model's bars would vanish under it.
    axes.set_ylim(0, max(top_for(stacks, height_pt), 26.5 if max(tops) > 6 else 0.0))
    _gpu_lines(axes)
    return figure


def scaling_figure(result: Plan, width_in: float = RESULT_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    """Peak per device against the sequence length, padded and packed, at the request's batch size."""
    figure = Figure(figsize=(width_in, 4.6), dpi=dpi, layout="constrained")
    axes = figure.add_subplot()
    lengths = [row["seq_length"] for row in result.scaling]
    for key, label, style, color in (("padded_bytes", "padded", "-", "#8c8c8c"),
                                     ("packed_bytes", "packed (padding-free)", "--", "#4e79a7")):
        axes.plot(lengths, [row[key] / GIB for row in result.scaling], style, marker="o", markersize=3,
                  label=label, color=color)
    axes.set_xscale("log", base=2)
    top = max(max(row["padded_bytes"], row["packed_bytes"]) for row in result.scaling) / GIB
    axes.set_ylim(0, top * 1.15)
    axes.axvline(result.request.seq_length, color="black", linewidth=0.8)
    _gpu_lines(axes)
    # 10-pt axis labels fit about 11 characters per inch less the y axis' margin.
    axes.set_xlabel(wrap_lines("sequence length (tokens per example; a length profile is cut to it)",
                               int(width_in * 11) - 10))
    axes.set_ylabel("GiB used on the card per device")
    axes.legend(fontsize=7, loc="upper left")
    profile = result.request.dataset or "equal lengths"
    axes.set_title(wrap_lines(f"Memory against sequence length (batch size {result.request.batch_size}, {profile})\n"
                              f"vertical line: the length asked", int(width_in * TITLE_CHARS_PER_IN)), fontsize=10)
    return figure


