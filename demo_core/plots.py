"""Figures for the app, drawn from the engine's own numbers: `preview(config)` and the run document.

Plain `matplotlib.figure.Figure` objects, never pyplot: pyplot keeps every figure in a global registry until it is
closed, which leaks in a long-running server and is not thread-safe. A Figure made directly is freed when dropped.

- `batch_figure(preview)`: the first batch as each collator builds it, and the attention mask each path computes.
- `lengths_figure(preview)`: the dataset's length histogram with its statistics.
- `throughput_figure(document)`, `loss_figure(document)`, `memory_figure(document)`: the results of a run.
- `anatomy_figure(document)`: where one profiled step's time went, per collator, by phase and by operation.
"""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from .collators import BASELINE, collator_spec

# Each collator's colour and line style come from its registry entry (the same in every figure); the line styles
# differ so that identical curves (padded and flatten losses) stay visible on top of each other.
EXAMPLE_COLORS = colormaps["tab10"].colors
PAD_COLOR = "#dcdcdc"
MASKED_COLOR = "#f0f0f0"  # computed then thrown away (dense mask)
LEAK_COLOR = "#7a0019"  # attention to another example (naive concat)
LABEL_MASK_COLOR = "black"
MB = 1e6  # memory is shown in MB (10^6 bytes), as the tables do
MEMORY_CATEGORY_COLORS = {"weights": "#4e79a7", "gradients": "#59a14f", "optimizer": "#e15759",
                          "activations": "#b07aa1", "temporary": "#edc948", "context": "#76b7b2"}

LEAK, NOT_COMPUTED, MASKED = -1, 0, 1  # mask image codes; 2 + i is "attends within example i"
MAX_GRID_COLUMNS = 1024  # wider padded grids are drawn one column per k slots: the picture, not every cell
MAX_GRID_ROWS = 16  # a batch of 64 would be 64 hairlines
FIGURE_DPI = 80  # about the width the page gives a figure; more pixels only cost encoding time
MASK_PIXELS = 360  # a packed row of T tokens has a T x T mask; draw it sampled at this many pixels per side
ALL_LABELS_UP_TO = 12  # label every boundary up to this many examples, then only some
MASK_TICKS = 7  # a mask panel is ~3 inches wide: more boundary labels than this overlap at a readable size


def _example_color(index: int):
    return EXAMPLE_COLORS[index % len(EXAMPLE_COLORS)]


def _example_cmap(count: int) -> ListedColormap:
    """Index 0 is padding/masked, 1..count the examples: images store `example + 1`."""
    return ListedColormap([PAD_COLOR] + [_example_color(i) for i in range(count)])


def _boundaries(cu_seqlens: list[int], most: int = ALL_LABELS_UP_TO) -> list[int]:
    """The cu_seqlens values worth a label: all of them for a small batch, else an even spread plus the ends."""
    if len(cu_seqlens) <= most + 1:
        return list(cu_seqlens)
    picks = np.linspace(0, len(cu_seqlens) - 1, most).round().astype(int)
    return [cu_seqlens[i] for i in sorted(set(picks))]


def _text_figure(message: str, width_in: float = 7.0, height_in: float = 3.0) -> Figure:
    """A figure that says why there is nothing to draw, instead of an empty frame."""
    figure = Figure(figsize=(width_in, height_in), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.axis("off")
    axes.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=11, color="#444444")
    return figure


# ----------------------------------------------------------------------------------------------------------------
# The first batch: padded grid, flattened row, BFD rows
# ----------------------------------------------------------------------------------------------------------------


def _draw_padded(axes, batch: dict) -> None:
    lengths = batch["lengths"]
    rows, width = len(lengths), max(lengths)
    shown = lengths[:MAX_GRID_ROWS]
    step = max(1, -(-width // MAX_GRID_COLUMNS))
    columns = np.arange(0, width, step)
    grid = np.array([np.where(columns < length, index + 1, 0) for index, length in enumerate(shown)])
    axes.imshow(grid, cmap=_example_cmap(len(shown)), vmin=0, vmax=len(shown), aspect="auto", interpolation="nearest",
                extent=(0, width, len(shown) - 0.5, -0.5))
    for index, length in enumerate(shown):
        axes.text(width * 1.01, index, f"{length} real + {width - length} pad", va="center", fontsize=8,
                  clip_on=False)
    axes.set_yticks(range(len(shown)), [f"ex {i}" for i in range(len(shown))], fontsize=8)
    axes.set_xlim(0, width)
    axes.set_xlabel("token slot in the row", fontsize=8)
    axes.tick_params(axis="x", labelsize=8)
    more = f" (first {len(shown)} of {rows} rows drawn)" if rows > len(shown) else ""
    axes.set_title(
        f"padded: {rows} rows × {width} slots = {batch['padded_slots']:,} slots for {batch['real_tokens']:,} real "
        f"tokens: {batch['pad_fraction']:.0%} of the compute is padding (grey){more}",
        loc="left", fontsize=10)


def _draw_segments(axes, lengths: list[int], y: float, height: float, first_color: int = 0) -> None:
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    axes.broken_barh(list(zip(starts, lengths)), (y, height),
                     facecolors=[_example_color(first_color + i) for i in range(len(lengths))],
                     edgecolor="white", linewidth=0.6)


def _draw_flattened(axes, positions_axes, batch: dict) -> None:
    lengths, cu_seqlens = batch["lengths"], batch["cu_seqlens"]
    total = cu_seqlens[-1]
    _draw_segments(axes, lengths, 0.0, 1.0)
    labelled = _boundaries(cu_seqlens)
    for rank, boundary in enumerate(labelled):
        # Alternate two heights so the labels of short neighbouring examples do not overlap.
        axes.text(boundary, 1.08 + 0.32 * (rank % 2), f"{boundary}", ha="center", va="bottom", fontsize=7.5)
    axes.vlines(cu_seqlens, -0.1, 1.05, color="black", linewidth=0.8)
    axes.text(0, 1.95, "cu_seqlens (where each example starts):", fontsize=8, va="bottom")
    masked = [index for index, label in enumerate(batch["labels"][0]) if label == -100]
    axes.plot(masked, [-0.3] * len(masked), marker="^", linestyle="none", color=LABEL_MASK_COLOR, markersize=5)
    axes.text(total, -0.3, "  ▲ label -100", color=LABEL_MASK_COLOR, fontsize=8, va="center", clip_on=False)
    axes.set_ylim(-0.6, 2.3)
    axes.set_xlim(0, total)
    axes.set_yticks([])
    axes.tick_params(axis="x", labelbottom=False)
    for side in ("left", "right", "top"):
        axes.spines[side].set_visible(False)
    axes.set_title(
        f"padding-free (flatten): the same {len(lengths)} examples in 1 row × {total:,} tokens, 0% padding.\n"
        f"Each example's first label is -100 (▲), so no token is trained to follow the example before it",
        loc="left", fontsize=10)
    positions = batch["position_ids"]
    positions_axes.plot(np.arange(len(positions)), positions, color="black", linewidth=0.9)
    positions_axes.set_xlim(0, total)
    positions_axes.set_ylabel("position_ids", fontsize=8)
    positions_axes.set_xlabel("token index in the packed row", fontsize=8)
    positions_axes.tick_params(labelsize=8)
    positions_axes.set_title("position_ids restart at 0 at each boundary, as if each example were alone",
                             loc="left", fontsize=8.5)


def _draw_packed_rows(axes, name: str, batch: dict, max_length: int) -> None:
    row_lengths = batch["row_lengths"]
    color = 0
    for row, lengths in enumerate(row_lengths):
        _draw_segments(axes, lengths, row - 0.4, 0.8, first_color=color)
        color += len(lengths)
        used = sum(lengths)
        axes.text(max_length * 1.01, row, f"{len(lengths)} example{'s' if len(lengths) > 1 else ''}, {used} tokens", va="center", fontsize=8,
                  clip_on=False)
    axes.set_xlim(0, max_length)
    axes.set_ylim(len(row_lengths) - 0.5, -0.5)
    axes.set_yticks(range(len(row_lengths)), [f"row {i}" for i in range(len(row_lengths))], fontsize=8)
    axes.set_xlabel(f"token slot in a packed row of at most {max_length} (max length)", fontsize=8)
    axes.tick_params(axis="x", labelsize=8)
    axes.set_title(
        f"{name} (TRL best-fit decreasing): {len(row_lengths)} packed rows holding {batch['examples']} examples, "
        f"regrouped from the whole dataset (so not the examples above);\n"
        f"the model sees them flattened into 1 row × {batch['real_tokens']:,} tokens, like flatten",
        loc="left", fontsize=10)


# ----------------------------------------------------------------------------------------------------------------
# Attention masks of the first batch
# ----------------------------------------------------------------------------------------------------------------


def _mask_image(lengths: list[int], panel: str) -> np.ndarray:
    """The mask sampled at up to (MASK_PIXELS, MASK_PIXELS): per (query, key) cell, NOT_COMPUTED, MASKED (computed,
    then thrown away), LEAK (attends another example) or 2 + example index (attends its own example).

    "padded": every example sits in a row of max(lengths) slots, and each row is an independent L x L block.
    """
    if panel == "padded":
        row_length = max(lengths)
        segment = np.repeat(np.arange(len(lengths)), row_length)
        position = np.tile(np.arange(row_length), len(lengths))
        real = position < np.repeat(lengths, row_length)
    else:
        segment = np.repeat(np.arange(len(lengths)), lengths)
        position = np.arange(len(segment))
        real = np.ones(len(segment), dtype=bool)
    total = len(segment)
    pixels = min(total, MASK_PIXELS)
    index = np.arange(pixels) * total // pixels
    query, key = index[:, None], index[None, :]
    causal = position[key] <= position[query]
    same = segment[query] == segment[key]
    attends = causal & same & real[query] & real[key]
    computed = {"padded": same, "dense": np.ones_like(same), "naive": causal, "varlen": same & causal}[panel]
    image = np.where(computed, MASKED, NOT_COMPUTED)
    if panel == "naive":
        image = np.where(causal & ~same, LEAK, image)
    return np.where(attends, 2 + segment[query], image)


# (panel key, title, score key in preview["cost"])
_MASK_PANELS = (
    ("padded", "padded: a causal L×L mask per row\n(grey: padding, computed anyway)", "attention_scores_padded"),
    ("naive", "naive concat: causal over the whole row\n(dark red: attends OTHER examples)",
     "attention_scores_dense_packed"),
    ("dense", "flatten + sdpa/eager: dense T×T mask\n(grey: computed, then masked out)",
     "attention_scores_dense_packed"),
    ("varlen", "flatten + varlen / flash-attn 2:\nonly the diagonal blocks are computed", "attention_scores_varlen"),
)
_SCORE_FORMULAS = {"attention_scores_padded": "B·L²", "attention_scores_dense_packed": "(Σsᵢ)²",
                   "attention_scores_varlen": "Σsᵢ²"}


def _panels_in_use(collators: list[str], attention: str) -> dict[str, list[str]]:
    """Which collator of this run computes which mask (the app highlights those panels)."""
    packed_panel = "varlen" if attention in ("varlen", "flash_attention_2") else "dense"
    panel_of_layout = {"padded": "padded", "naive": "naive", "packed": packed_panel}
    in_use: dict[str, list[str]] = {}
    for name in collators:
        in_use.setdefault(panel_of_layout[collator_spec(name).layout], []).append(name)
    return in_use


def _draw_mask(axes, preview: dict, lengths: list[int], panel: str, title: str, score_key: str,
               used_by: list[str]) -> None:
    image = _mask_image(lengths, panel)
    if panel == "padded":
        total = len(lengths) * max(lengths)
        boundaries = [i * max(lengths) for i in range(len(lengths) + 1)]
    else:
        total = sum(lengths)
        boundaries = [int(b) for b in np.concatenate([[0], np.cumsum(lengths)])]
    colors = [LEAK_COLOR, "white", PAD_COLOR] + [_example_color(i) for i in range(len(lengths))]
    axes.imshow(image, cmap=ListedColormap(colors), vmin=LEAK, vmax=len(lengths) + 1, interpolation="nearest",
                extent=(0, total, total, 0))
    if panel == "varlen":
        for start, length in zip(boundaries[:-1], lengths):
            axes.add_patch(Rectangle((start, start), length, length, fill=False, edgecolor="black", linewidth=0.7))
    ticks = _boundaries(boundaries, MASK_TICKS)
    axes.set_xticks(ticks, [str(t) for t in ticks], fontsize=8, rotation=90)
    axes.set_yticks(ticks, [str(t) for t in ticks], fontsize=8)
    axes.set_xlabel("key (attended token)", fontsize=8.5)
    axes.set_ylabel("query token", fontsize=8.5)
    scores = preview["cost"][score_key]
    axes.set_title(f"{title}\n{_SCORE_FORMULAS[score_key]} = {scores:,} scores", fontsize=9.5)
    if used_by:
        color = collator_spec(used_by[0]).color
        for spine in axes.spines.values():
            spine.set_edgecolor(color)
            spine.set_linewidth(3)
        axes.text(0.5, -0.3, f"used by {', '.join(used_by)} in this run", transform=axes.transAxes, ha="center",
                  va="top", fontsize=8.5, fontweight="bold", color=color)


def _padded_view(lengths: list[int]) -> dict:
    """The padded batch of these examples, for when `padded` is not among the collators."""
    slots = len(lengths) * max(lengths)
    return {"lengths": lengths, "padded_slots": slots, "real_tokens": sum(lengths),
            "pad_fraction": 1 - sum(lengths) / slots}


def _flat_view(lengths: list[int]) -> dict:
    """The flattened row of these examples, for when `flatten` is not among the collators."""
    return {"lengths": lengths, "cu_seqlens": [int(b) for b in np.concatenate([[0], np.cumsum(lengths)])],
            "position_ids": [position for length in lengths for position in range(length)],
            "labels": [[-100 if position == 0 else 0 for length in lengths for position in range(length)]]}


def batch_figure(preview: dict) -> Figure:
    """The first batch under each selected collator (left) and the attention masks (right), from `preview()`.

    The padded grid and the flattened row are always drawn, since the picture exists to contrast them; they use
    the engine's batches when those collators are selected.
    """
    batches, config = preview["batches"], preview["config"]
    specs = {name: collator_spec(name) for name in batches}
    # Every collator but the packed-rows ones batches the same first examples; those regroup the whole dataset.
    unpacked = [name for name, spec in specs.items() if not spec.packed_rows]
    lengths = batches[unpacked[0]]["lengths"] if unpacked else batches[next(iter(batches))]["lengths"]
    padded = next((batches[name] for name in unpacked if specs[name].layout == "padded"), _padded_view(lengths))
    flat = next((batches[name] for name in unpacked if specs[name].layout == "packed"), _flat_view(lengths))
    packed_rows = next((name for name, spec in specs.items() if spec.packed_rows), None)
    # Top to bottom: padded grid, flattened row, its position_ids, BFD rows if selected, then the four masks. The
    # layout is fixed in inches (spacer rows hold titles and axis labels) rather than solved by constrained layout,
    # which measures every text twice and doubled the time to the first picture.
    rows = [("space", 0.55), ("space", 0.35), ("padded", min(len(lengths), MAX_GRID_ROWS) * 0.28 + 0.3),
            ("space", 1.15), ("flat", 0.9), ("space", 0.35), ("positions", 0.8), ("space", 0.5)]
    if packed_rows is not None:
        row_count = len(batches[packed_rows]["row_lengths"])
        rows += [("space", 0.6), ("packed_rows", row_count * 0.28 + 0.3), ("space", 0.5)]
    rows += [("space", 0.75), ("masks", 3.4), ("space", 1.0)]
    heights = [height for _, height in rows]
    figure = Figure(figsize=(16, sum(heights)), dpi=FIGURE_DPI)
    grid = figure.add_gridspec(len(rows), 1, height_ratios=heights, hspace=0, left=0.05, right=0.88, top=1, bottom=0)
    slot = {name: index for index, (name, _) in enumerate(rows) if name != "space"}
    _draw_padded(figure.add_subplot(grid[slot["padded"]]), padded)
    flat_axes = figure.add_subplot(grid[slot["flat"]])
    _draw_flattened(flat_axes, figure.add_subplot(grid[slot["positions"]], sharex=flat_axes), flat)
    if packed_rows is not None:
        _draw_packed_rows(figure.add_subplot(grid[slot["packed_rows"]]), packed_rows, batches[packed_rows],
                          config["max_length"])
    masks = grid[slot["masks"]].subgridspec(1, len(_MASK_PANELS), wspace=0.35)
    in_use = _panels_in_use(config["collators"], preview["attention"])
    for index, (panel, title, score_key) in enumerate(_MASK_PANELS):
        _draw_mask(figure.add_subplot(masks[index]), preview, lengths, panel, title, score_key, in_use.get(panel, []))
    figure.suptitle(
        f"The first batch ({len(lengths)} examples) as each collator builds it, and the attention each "
        f"path computes for it ({preview['attention']} attention on {preview['device']})",
        fontsize=12, x=0.01, y=1 - 0.15 / sum(heights), ha="left", va="top")
    figure.legend(
        handles=[Patch(color=_example_color(i), label=f"example {i}") for i in range(min(4, len(lengths)))]
        + [Patch(color=PAD_COLOR, label="padding / masked: computed, then wasted"),
           Patch(color=LEAK_COLOR, label="attention leaking across examples"),
           Line2D([], [], color=LABEL_MASK_COLOR, marker="^", linestyle="none", label="label -100: not trained on")],
        loc="lower center", ncols=7, fontsize=8.5, frameon=False)
    return figure


# ----------------------------------------------------------------------------------------------------------------
# Dataset lengths
# ----------------------------------------------------------------------------------------------------------------


def lengths_figure(preview: dict) -> Figure:
    lengths = np.asarray(preview["lengths"])
    stats = preview["dataset_stats"]
    figure = Figure(figsize=(7.5, 4.2), dpi=FIGURE_DPI, layout="constrained")
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
    axes.set_title(f"{stats['name']}: example lengths. Padding pays for the longest example in every batch;\n"
                   f"the wider this spread, the more packing saves", fontsize=10)
    return figure


# ----------------------------------------------------------------------------------------------------------------
# Results of a run
# ----------------------------------------------------------------------------------------------------------------


def _result_label(result: dict) -> str:
    return result["collator"] + ("\n(partial)" if result.get("partial") else "")


def _collator_ticks(axes, positions: list[float], labels: list[str]) -> None:
    """Collator names under their bars; slanted once there are more than a figure's width holds side by side."""
    slanted = len(labels) > 4
    axes.set_xticks(positions, labels, fontsize=8.5 if slanted else 10, rotation=30 if slanted else 0,
                    ha="right" if slanted else "center", rotation_mode="anchor")


def throughput_figure(document: dict) -> Figure:
    """Median real tokens/s per collator with the middle half of its steps as a whisker; the slots ideal as a line
    and each collator's work ideal as a short dotted mark over its bar."""
    results = document["results"]
    if not results:
        return _text_figure("No collator has finished yet.")
    comparison = document["comparison"]
    figure = Figure(figsize=(6.5, 4.6), dpi=FIGURE_DPI, layout="constrained")
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
    for bar, result, (_, high) in zip(bars, results, ranges):
        entry = comparison[result["collator"]]
        speedup, center = entry["speedup_vs_padded"], bar.get_x() + bar.get_width() / 2
        text = ("no timed step" if result["tokens_per_s"] is None else f"{result['tokens_per_s']:,.0f} tok/s"
                if speedup is None else f"{speedup:.2f}×") + (" ⚠" if entry.get("flags") else "")
        axes.text(center, high * 1.01, text, ha="center", va="bottom", fontsize=11, fontweight="bold",
                  bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
        if result["samples_per_s"] is not None:
            axes.text(center, bar.get_height() / 2, f"{result['samples_per_s']:.1f}\nsamples/s", ha="center",
                      va="center", fontsize=8, color="white")
        work = entry.get("work_ideal_speedup")
        if padded is not None and work is not None and result is not padded:
            axes.hlines(padded["tokens_per_s"] * work, bar.get_x(), bar.get_x() + bar.get_width(), colors="black",
                        linestyles=":", linewidth=2)
            axes.text(bar.get_x() + bar.get_width(), padded["tokens_per_s"] * work, f"work ideal {work:.2f}× ",
                      ha="right", va="top", fontsize=7, color="white")
    top = max(high for _, high in ranges) or 1.0
    if padded is not None:
        ideal = padded["tokens_per_s"] * document["ideal_speedup"]
        axes.axhline(ideal, color="black", linestyle="--", linewidth=1)
        axes.text(-0.4, ideal, f"ideal {document['ideal_speedup']:.2f}× = padded × slots / real tokens",
                  va="bottom", fontsize=8)
        top = max(top, ideal)
    axes.set_ylim(0, top * 1.18)
    _collator_ticks(axes, list(range(len(results))), [_result_label(r) for r in results])
    axes.set_ylabel("real tokens per second (padding not counted)")
    axes.set_title("Throughput on the same examples, same steps (trimmed mean of timed steps)\n(whisker: middle half of "
                   "steps; bar label: speedup over padded; ⚠: see the flags)", fontsize=10)
    return figure


def loss_figure(document: dict) -> Figure:
    results = document["results"]
    if not results:
        return _text_figure("No collator has finished yet.")
    figure = Figure(figsize=(6.5, 4.6), dpi=FIGURE_DPI, layout="constrained")
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
    axes.legend(fontsize=8)
    axes.set_title("Loss per step: correct packing trains exactly like padding\n"
                   "(naive concat differs: its examples see each other)", fontsize=10)
    return figure


def _memory_error_label(memory: dict) -> str:
    """The estimate's error over the categories that were measured, as the engine defines it: (est - meas) / meas.
    The asterisk points at the title, which names the categories left out."""
    measured = {category: value for category, value in (memory.get("measured") or {}).items() if value is not None}
    estimate = sum(memory.get("estimate", {}).get(category, 0) for category in measured)
    total = sum(measured.values())
    return f"est. {(estimate - total) / total:+.0%}*" if estimate and total else ""


def memory_figure(document: dict) -> Figure:
    """Per collator a pair of stacked bars: the estimate (hatched) and the measurement (solid)."""
    results = [result for result in document["results"] if (result.get("memory") or {}).get("estimate")]
    if not results:
        return _text_figure("Memory breakdown: not available for this run.\n"
                            "(The engine returned no per-category memory numbers.)", 6.5, 4.6)
    figure = Figure(figsize=(6.5, 4.6), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    not_measured: set[str] = set()
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
        axes.text(index, top, f"{measured_total:,.1f} MB\n{_memory_error_label(memory)}", ha="center",
                  va="bottom", fontsize=8)
    _collator_ticks(axes, list(range(len(results))), [_result_label(result) for result in results])
    axes.set_ylabel("MB at the peak of a step")
    handles = [Patch(color=color, label=category) for category, color in MEMORY_CATEGORY_COLORS.items()]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="//", label="estimate (left bar)"))
    axes.legend(handles=handles, fontsize=7.5, ncols=2, loc="upper left")
    note = (f"\n* error over the measured categories ({', '.join(sorted(not_measured))} not measurable here)"
            if not_measured else "")
    axes.set_title(f"Memory at the peak of a training step, per category\n"
                   f"(left, hatched: estimate; right, solid: measured){note}", fontsize=9.5)
    axes.set_ylim(0, axes.get_ylim()[1] * 1.45)  # room for the legend above the tallest bar
    return figure


# Phases and operation classes of the time anatomy (anatomy.py), in stacking order, with their colours.
PHASE_COLORS = {"forward": "#4e79a7", "backward": "#f28e2b", "optimizer": "#e15759", "data": "#76b7b2",
                "other": "#bab0ac"}
OP_COLORS = {"matmul": "#4e79a7", "normalization": "#59a14f", "elementwise": "#edc948", "attention": "#b07aa1",
             "optimizer": "#e15759", "data": "#76b7b2", "other": "#bab0ac"}


def anatomy_figure(document: dict) -> Figure:
    """Stacked bars of one profiled step per collator: by phase (with backward / forward) and by operation class."""
    profiled = [result for result in document["results"] if result.get("time_anatomy")]
    if not profiled:
        return _text_figure("Time anatomy: no step was profiled yet\n(step 2 of each burst is the profiled one).",
                            6.5, 4.6)
    figure = Figure(figsize=(9.5, 4.6), dpi=FIGURE_DPI, layout="constrained")
    for axes, part, colors in zip(figure.subplots(1, 2, sharey=True), ("phases", "ops"), (PHASE_COLORS, OP_COLORS)):
        for position, result in enumerate(profiled):
            anatomy, bottom = result["time_anatomy"], 0.0
            for name, color in colors.items():
                milliseconds = anatomy[part][name] * 1000
                axes.bar(position, milliseconds, bottom=bottom, color=color, edgecolor="white", linewidth=0.5,
                         label=name if position == 0 else None)
                bottom += milliseconds
            phases = anatomy["phases"]
            label = (f"bwd/fwd {phases['backward'] / phases['forward']:.1f}×" if part == "phases" and phases["forward"]
                     else f"{anatomy['step_s'] * 1000:.0f} ms")
            axes.text(position, bottom, label, ha="center", va="bottom", fontsize=8)
        axes.set_xticks(range(len(profiled)), [_result_label(r) for r in profiled])
        axes.legend(fontsize=7, loc="upper right")
        axes.set_title("by phase" if part == "phases" else "by operation", fontsize=10)
    figure.axes[0].set_ylabel("ms in the profiled step (step 2)")
    figure.axes[0].set_ylim(0, figure.axes[0].get_ylim()[1] * 1.3)  # room for the legend above the tallest bar
    figure.suptitle("Where one training step's time goes (torch.profiler; the profiler slows the step, compare shares)",
                    fontsize=10)
    return figure
