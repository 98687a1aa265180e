"""The page's main picture: the first batch as each collator builds it, and the attention mask each path computes
for it, drawn from `preview()`'s numbers (`batch_figure`).

Top to bottom: the padded grid, the same examples flattened into one row (its `cu_seqlens`, -100 labels and
`position_ids`), the packed rows of bfd / trl-bfd when selected, and the four attention masks. The picture is laid
out for the width the page shows it at (`BatchLayout`): on a phone its titles wrap and the masks go two by two, so
that its text reads at the same size everywhere.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from demo_core.collators import collator_spec
from demo_core.config import PER_SEGMENT_ATTENTION
from presentation.figure_text import wrap_lines
from presentation.plots import FIGURE_DPI

EXAMPLE_COLORS = colormaps["tab10"].colors  # one colour per example of the batch (not per collator)
PAD_COLOR = "#dcdcdc"
LEAK_COLOR = "#7a0019"  # attention to another example (naive concat)
LABEL_MASK_COLOR = "black"
NO_LOSS_HATCH = "////"  # over an example's colour: its tokens that carry no loss (the prompt's, label -100)
NO_LOSS_FADE = (1, 1, 1, 0.45)  # and faded, for a screen too small to show the hatch
NO_LOSS_GID = "no-loss"  # the artists that mark them, so tests can find them among the figure's

LEAK, NOT_COMPUTED, MASKED = -1, 0, 1  # mask image codes; 2 + i is "attends within example i"
MAX_GRID_COLUMNS = 1024  # wider padded grids are drawn one column per k slots: the picture, not every cell
MAX_GRID_ROWS = 16  # a batch of 64 would be 64 hairlines
MASK_PIXELS = 360  # a packed row of T tokens has a T x T mask; draw it sampled at this many pixels per side
ALL_LABELS_UP_TO = 12  # label every boundary up to this many examples, then only some
MASK_TICKS = 7  # a mask panel is ~3 inches wide: more boundary labels than this overlap at a readable size
# Text sizes in points, which the page shows at about as many pixels (see `BatchLayout`).
FIGURE_TITLE_PT, TITLE_PT, LABEL_PT, SMALL_PT = 12, 10.5, 10, 9
LINE_SPACING = 1.3  # matplotlib's line height, in font sizes
MASK_AXIS_LABELS_PT = 62  # below a mask: its tick labels (rotated) and axis label, in points
MASK_LEFT_IN = 0.75  # left of a mask: its tick labels and axis label
ROW_NAMES_IN, ROW_LABELS_IN = 0.6, 2.1  # left and right of a row panel: "row 3", "2 examples, 1021 tokens"
CHARS_PER_IN, MASK_CHARS_PER_IN = 11, 12  # characters per inch of width of a title (TITLE_PT), a mask's (LABEL_PT)
WIDE_FROM_IN = 9  # narrower pictures put two masks side by side instead of four
BATCH_MIN_IN, BATCH_MAX_IN = 4, 16  # narrower cannot hold two masks, wider has nothing more to show


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


def _height_in(text: str, points: float) -> float:
    """The height of a (wrapped) text in inches."""
    return (text.count("\n") + 1) * points * LINE_SPACING / 72


def _padded_title(batch: dict) -> str:
    lengths = batch["lengths"]
    rows, shown = len(lengths), min(len(lengths), MAX_GRID_ROWS)
    more = f" (first {shown} of {rows} rows drawn)" if rows > shown else ""
    return (f"padded: {rows} rows × {max(lengths)} slots = {batch['padded_slots']:,} slots for "
            f"{batch['real_tokens']:,} real tokens: {batch['pad_fraction']:.0%} of the compute is padding (grey){more}")


def _flat_title(batch: dict, loss_on: str) -> str:
    total = batch["cu_seqlens"][-1]
    no_loss = sum(count for _, count in no_loss_spans(batch["labels"][0], batch["cu_seqlens"][:-1], total))
    masked = (f";\nhatched: the {no_loss:,} of {total:,} tokens with no loss (loss on {loss_on}: label -100)"
              if no_loss else "")
    return (f"padding-free (flatten): the same {len(batch['lengths'])} examples in 1 row × "
            f"{total:,} tokens, 0% padding.\n"
            f"Each example's first label is -100 (▲), so no token is trained to follow the example before it{masked}")


def _packed_rows_title(name: str, batch: dict, max_length: int) -> str:
    return (f"{name} (TRL best-fit decreasing): {len(batch['row_lengths'])} rows of at most {max_length} tokens (the "
            f"max length) holding {batch['examples']} examples, regrouped from the whole dataset (so not the examples "
            f"above; other colours);\n"
            f"the model sees them flattened into 1 row × {batch['real_tokens']:,} tokens, like flatten")


def _draw_padded(axes, batch: dict, title: str) -> None:
    lengths = batch["lengths"]
    width = max(lengths)
    shown = lengths[:MAX_GRID_ROWS]
    step = max(1, -(-width // MAX_GRID_COLUMNS))
    columns = np.arange(0, width, step)
    grid = np.array([np.where(columns < length, index + 1, 0) for index, length in enumerate(shown)])
    axes.imshow(grid, cmap=_example_cmap(len(shown)), vmin=0, vmax=len(shown), aspect="auto", interpolation="nearest",
                extent=(0, width, len(shown) - 0.5, -0.5))
    for index, length in enumerate(shown):
        axes.text(width * 1.01, index, f"{length} real + {width - length} pad", va="center", fontsize=LABEL_PT,
                  clip_on=False)
        if "labels" in batch:  # the collated labels: -100 on padding, and on the prompt with a loss mask
            _draw_no_loss(axes, no_loss_spans(batch["labels"][index], [0], length), index - 0.5, 1.0)
    axes.set_yticks(range(len(shown)), [f"ex {i}" for i in range(len(shown))], fontsize=LABEL_PT)
    axes.set_xlim(0, width)
    axes.set_xlabel("token slot in the row", fontsize=LABEL_PT)
    axes.tick_params(axis="x", labelsize=LABEL_PT)
    axes.set_title(title, loc="left", fontsize=TITLE_PT)


def _draw_segments(axes, lengths: list[int], y: float, height: float, first_color: int = 0) -> None:
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    axes.broken_barh(list(zip(starts, lengths)), (y, height),
                     facecolors=[_example_color(first_color + i) for i in range(len(lengths))],
                     edgecolor="white", linewidth=0.6)


def no_loss_spans(labels: list[int], starts: list[int], length: int) -> list[tuple[int, int]]:
    """(start, count) runs of a row's first `length` tokens whose label is -100, other than the examples' first
    tokens (`starts`): the tokens the loss mask leaves out (the prompt's, with loss on completion or assistant).
    Each example's first label is -100 in every packed layout, whatever the loss: it is marked apart (▲)."""
    starts_set = set(starts)
    masked = [index for index in range(length) if labels[index] == -100 and index not in starts_set]
    spans: list[tuple[int, int]] = []
    for index in masked:
        if spans and spans[-1][0] + spans[-1][1] == index:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((index, 1))
    return spans


def _draw_no_loss(axes, spans: list[tuple[int, int]], y: float, height: float) -> None:
    """Hatch the no-loss tokens over their example's colour, so the example stays recognisable."""
    if spans:
        axes.broken_barh(spans, (y, height), facecolors=NO_LOSS_FADE, edgecolor="white", hatch=NO_LOSS_HATCH,
                         linewidth=0, gid=NO_LOSS_GID)


def _draw_flattened(axes, positions_axes, batch: dict, title: str, positions_title: str, labels: int) -> None:
    lengths, cu_seqlens = batch["lengths"], batch["cu_seqlens"]
    total = cu_seqlens[-1]
    _draw_segments(axes, lengths, 0.0, 1.0)
    labelled = _boundaries(cu_seqlens, labels)
    for rank, boundary in enumerate(labelled):
        # Alternate two heights so the labels of short neighbouring examples do not overlap.
        axes.text(boundary, 1.08 + 0.32 * (rank % 2), f"{boundary}", ha="center", va="bottom", fontsize=SMALL_PT)
    axes.vlines(cu_seqlens, -0.1, 1.05, color="black", linewidth=0.8)
    axes.text(0, 1.95, "cu_seqlens (where each example starts):", fontsize=SMALL_PT, va="bottom")
    labels, starts = batch["labels"][0], cu_seqlens[:-1]
    _draw_no_loss(axes, no_loss_spans(labels, starts, total), 0.0, 1.0)
    boundaries = [start for start in starts if labels[start] == -100]
    axes.plot(boundaries, [-0.3] * len(boundaries), marker="^", linestyle="none", color=LABEL_MASK_COLOR,
              markersize=5)
    axes.text(total, -0.3, "  ▲ label -100", color=LABEL_MASK_COLOR, fontsize=SMALL_PT, va="center", clip_on=False)
    axes.set_ylim(-0.6, 2.3)
    axes.set_xlim(0, total)
    axes.set_yticks([])
    axes.tick_params(axis="x", labelbottom=False)
    for side in ("left", "right", "top"):
        axes.spines[side].set_visible(False)
    axes.set_title(title, loc="left", fontsize=TITLE_PT)
    positions = batch["position_ids"]
    positions_axes.plot(np.arange(len(positions)), positions, color="black", linewidth=0.9)
    positions_axes.set_xlim(0, total)
    positions_axes.set_ylabel("position_ids", fontsize=SMALL_PT)
    positions_axes.set_xlabel("token index in the packed row", fontsize=LABEL_PT)
    positions_axes.tick_params(labelsize=SMALL_PT)
    positions_axes.set_title(positions_title, loc="left", fontsize=LABEL_PT)


def _draw_packed_rows(axes, batch: dict, max_length: int, title: str, first_color: int) -> None:
    """The packed rows, their examples coloured from `first_color` on (they are not the first batch's)."""
    row_lengths, labels = batch["row_lengths"], batch["labels"][0]
    color, offset = first_color, 0
    for row, lengths in enumerate(row_lengths):
        _draw_segments(axes, lengths, row - 0.4, 0.8, first_color=color)
        # The batch's labels are the rows flattened one after another: this row's are the next sum(lengths).
        row_labels = labels[offset:offset + sum(lengths)]
        starts = [int(start) for start in np.concatenate([[0], np.cumsum(lengths)[:-1]])]
        _draw_no_loss(axes, no_loss_spans(row_labels, starts, sum(lengths)), row - 0.4, 0.8)
        offset += sum(lengths)
        color += len(lengths)
        axes.text(max_length * 1.01, row, f"{len(lengths)} example{'s' if len(lengths) > 1 else ''}, "
                  f"{sum(lengths)} tokens", va="center", fontsize=LABEL_PT, clip_on=False)
    axes.set_xlim(0, max_length)
    axes.set_ylim(len(row_lengths) - 0.5, -0.5)
    axes.set_yticks(range(len(row_lengths)), [f"row {i}" for i in range(len(row_lengths))], fontsize=LABEL_PT)
    axes.set_xlabel("token slot in the packed row", fontsize=LABEL_PT)
    axes.tick_params(axis="x", labelsize=LABEL_PT)
    axes.set_title(title, loc="left", fontsize=TITLE_PT)


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
    packed_panel = "varlen" if attention in PER_SEGMENT_ATTENTION else "dense"
    panel_of_layout = {"padded": "padded", "naive": "naive", "packed": packed_panel}
    in_use: dict[str, list[str]] = {}
    for name in collators:
        in_use.setdefault(panel_of_layout[collator_spec(name).layout], []).append(name)
    return in_use


def _mask_title(preview: dict, title: str, score_key: str) -> str:
    return f"{title}\n{_SCORE_FORMULAS[score_key]} = {preview['cost'][score_key]:,} scores"


def _used_by_text(used_by: list[str]) -> str:
    return f"used by {', '.join(used_by)} in this run" if used_by else ""


def _draw_mask(axes, lengths: list[int], panel: str, title: str, used_by: list[str], used_by_text: str,
               tick_count: int) -> None:
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
    ticks = _boundaries(boundaries, tick_count)
    axes.set_xticks(ticks, [str(t) for t in ticks], fontsize=SMALL_PT, rotation=90)
    axes.set_yticks(ticks, [str(t) for t in ticks], fontsize=SMALL_PT)
    axes.set_xlabel("key (attended token)", fontsize=LABEL_PT)
    axes.set_ylabel("query token", fontsize=LABEL_PT)
    axes.set_title(title, fontsize=LABEL_PT)
    if used_by:
        color = collator_spec(used_by[0]).color
        for spine in axes.spines.values():
            spine.set_edgecolor(color)
            spine.set_linewidth(3)
        axes.annotate(used_by_text, (0.5, 0), xycoords="axes fraction", xytext=(0, -MASK_AXIS_LABELS_PT),
                      textcoords="offset points", ha="center", va="top", fontsize=LABEL_PT, fontweight="bold",
                      color=color)


def _padded_view(lengths: list[int], flat: dict) -> dict:
    """The padded batch of these examples, for when `padded` is not among the collators: each row's labels those
    of its example in the flattened row (`flat`), then -100 padding."""
    slots = len(lengths) * max(lengths)
    starts = flat["cu_seqlens"][:-1]
    labels = [flat["labels"][0][start:start + length] + [-100] * (max(lengths) - length)
              for start, length in zip(starts, lengths)]
    return {"lengths": lengths, "padded_slots": slots, "real_tokens": sum(lengths),
            "pad_fraction": 1 - sum(lengths) / slots, "labels": labels}


def _flat_view(lengths: list[int], batch: dict) -> dict:
    """The flattened row of these examples, for when `flatten` is not among the collators: its labels from
    `batch`'s collated ones (one row already, or each padded row's real tokens in turn), each example's first -100
    as flattening sets it."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rows = [row[:length] for row, length in zip(batch["labels"], lengths)] if len(batch["labels"]) > 1 else [
        batch["labels"][0][start:start + length] for start, length in zip(starts, lengths)]
    return {"lengths": lengths, "cu_seqlens": [int(b) for b in np.concatenate([[0], np.cumsum(lengths)])],
            "position_ids": [position for length in lengths for position in range(length)],
            "labels": [[-100 if position == 0 else label for row in rows for position, label in enumerate(row)]]}


# ----------------------------------------------------------------------------------------------------------------
# The picture, laid out for its width
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """The batch picture laid out for a width in inches. A figure shown at FIGURE_DPI CSS pixels per inch draws a
    p-point font about 1.1 p pixels high: the page asks for the width it will show the picture at, so its text is
    that size on a desktop and on a phone alike, and the layout decides what fits on a line."""

    width_in: float

    @property
    def wrap(self) -> int:
        """Characters per line of a title."""
        return int(self.width_in * CHARS_PER_IN)

    @property
    def mask_columns(self) -> int:
        return 4 if self.width_in >= WIDE_FROM_IN else 2

    @property
    def mask_wrap(self) -> int:
        """Characters per line of a mask panel's title."""
        return int((self.width_in * 0.9 / self.mask_columns - 0.3) * MASK_CHARS_PER_IN)

    @property
    def rows_left(self) -> float:
        """Where the row panels (padded grid, flattened row, packed rows) start: their row names sit left of it."""
        return ROW_NAMES_IN / self.width_in

    @property
    def rows_right(self) -> float:
        """Where the row panels end: each row's label ("57 real + 199 pad") sits right of it."""
        return 1 - ROW_LABELS_IN / self.width_in

    @property
    def legend_columns(self) -> int:
        return 7 if self.width_in >= 15 else 3 if self.width_in >= 8 else 1

    @property
    def boundary_labels(self) -> int:
        """How many cu_seqlens values the flattened row can label side by side."""
        return min(ALL_LABELS_UP_TO, int(self.width_in))

    @property
    def mask_ticks(self) -> int:
        """How many boundaries a mask panel can label side by side (its labels are turned upright)."""
        return min(MASK_TICKS, int(self.width_in * 0.9 / self.mask_columns * 2))


def _inset(cell, left: float, right: float):
    """A row of the figure's single column, narrowed to [left, right] of the figure's width."""
    return cell.subgridspec(1, 3, width_ratios=[left, right - left, 1 - right], wspace=0)[1]


def _row_axes(figure: Figure, cell, layout: BatchLayout, **options):
    """The axes of a row panel (padded grid, flattened row, packed rows), its labels in the right margin."""
    return figure.add_subplot(_inset(cell, layout.rows_left, layout.rows_right), **options)


def _shown_batches(preview: dict) -> tuple[list[int], dict, dict, str | None]:
    """(the first batch's lengths, its padded grid, its flattened row, the packed-rows collator or None). The padded
    grid and the flattened row are always drawn, from the engine's batches when those collators are selected."""
    batches = preview["batches"]
    specs = {name: collator_spec(name) for name in batches}
    # Every collator but the packed-rows ones batches the same first examples; those regroup the whole dataset.
    unpacked = [name for name, spec in specs.items() if not spec.packed_rows]
    source = batches[unpacked[0] if unpacked else next(iter(batches))]
    lengths = source["lengths"]
    flat = next((batches[name] for name in unpacked if specs[name].layout == "packed"), None) or _flat_view(
        lengths, source)
    padded = next((batches[name] for name in unpacked if specs[name].layout == "padded"), None) or _padded_view(
        lengths, flat)
    packed_rows = next((name for name, spec in specs.items() if spec.packed_rows), None)
    return lengths, padded, flat, packed_rows


def _texts(preview: dict, layout: BatchLayout, lengths: list[int], padded: dict, flat: dict,
           packed_rows: str | None) -> tuple[dict, list, list]:
    """(the titles by panel, the mask panels with their titles and users, the legend's handles), wrapped to fit."""
    batches, config = preview["batches"], preview["config"]
    wrap = functools.partial(wrap_lines, width=layout.wrap)
    titles = {
        "figure": wrap(f"The first batch ({len(lengths)} examples) as each collator builds it, and the attention each "
                       f"path computes for it ({preview['attention']} attention on {preview['device']})",
                       width=int(layout.wrap * TITLE_PT / FIGURE_TITLE_PT)),
        "padded": wrap(_padded_title(padded)),
        "flat": wrap(_flat_title(flat, preview["dataset_stats"].get("loss_on", "all"))),
        "positions": wrap("position_ids restart at 0 at each boundary, as if each example were alone"),
    }
    if packed_rows is not None:
        titles["packed_rows"] = wrap(_packed_rows_title(packed_rows, batches[packed_rows], config["max_length"]))
    in_use = _panels_in_use(config["collators"], preview["attention"])
    masks = [(panel, wrap(_mask_title(preview, title, score_key), width=layout.mask_wrap), in_use.get(panel, []),
              wrap(_used_by_text(in_use.get(panel, [])), width=layout.mask_wrap))
             for panel, title, score_key in _MASK_PANELS]
    legend = [Patch(color=_example_color(i), label=f"example {i}") for i in range(min(4, len(lengths)))] + [
        Patch(color=PAD_COLOR, label="padding / masked: computed, then wasted"),
        Patch(color=LEAK_COLOR, label="attention leaking across examples"),
        Line2D([], [], color=LABEL_MASK_COLOR, marker="^", linestyle="none", label="label -100: not trained on")]
    if no_loss_spans(flat["labels"][0], flat["cu_seqlens"][:-1], flat["cu_seqlens"][-1]):
        legend.append(Patch(facecolor=_example_color(0), edgecolor="white", hatch=NO_LOSS_HATCH,
                            label="no loss (prompt, masked -100)"))
    return titles, masks, legend


def _rows(layout: BatchLayout, titles: dict, lengths: list[int], packed_row_count: int | None, groups: list,
          mask_in: float, legend: list) -> list[tuple[str, float]]:
    """Top to bottom, in inches: each panel with the room its title (above) and axis labels (below) need. The layout
    is computed here rather than solved by constrained layout, which measures every text twice and doubled the
    time to the first picture."""
    rows = [("space", _height_in(titles["figure"], FIGURE_TITLE_PT) + 0.3),
            ("space", _height_in(titles["padded"], TITLE_PT) + 0.1),
            ("padded", min(len(lengths), MAX_GRID_ROWS) * 0.28 + 0.3), ("space", 0.55),
            ("space", _height_in(titles["flat"], TITLE_PT) + 0.1), ("flat", 0.95),
            ("space", _height_in(titles["positions"], LABEL_PT) + 0.2), ("positions", 0.8), ("space", 0.55)]
    if packed_row_count is not None:
        rows += [("space", _height_in(titles["packed_rows"], TITLE_PT) + 0.1),
                 ("packed_rows", packed_row_count * 0.28 + 0.3), ("space", 0.55)]
    for index, group in enumerate(groups):
        rows += [("space", max(_height_in(title, LABEL_PT) for _, title, _, _ in group) + 0.25),
                 (f"masks {index}", mask_in),
                 ("space", 1.0 + max(_height_in(text, LABEL_PT) for *_, text in group))]
    rows.append(("space", -(-len(legend) // layout.legend_columns) * _height_in("", LABEL_PT) * 1.2 + 0.2))
    return rows


def batch_figure(preview: dict, width_in: float = BATCH_MAX_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    """The first batch under each selected collator (top) and the attention masks (bottom), from `preview()`, laid
    out `width_in` inches wide (narrow: titles wrapped, masks two by two), `dpi` pixels per inch (the page asks for
    its screen's device pixels: serving.page.Screen).

    The padded grid and the flattened row are always drawn, since the picture exists to contrast them; they use
    the engine's batches when those collators are selected.
    """
    layout = BatchLayout(min(max(width_in, BATCH_MIN_IN), BATCH_MAX_IN))
    batches, config = preview["batches"], preview["config"]
    lengths, padded, flat, packed_rows = _shown_batches(preview)
    titles, masks, legend = _texts(preview, layout, lengths, padded, flat, packed_rows)
    mask_in = min(3.4, layout.width_in * 0.88 / layout.mask_columns - 0.75)
    groups = [masks[i:i + layout.mask_columns] for i in range(0, len(masks), layout.mask_columns)]
    rows = _rows(layout, titles, lengths, None if packed_rows is None else len(batches[packed_rows]["row_lengths"]),
                 groups, mask_in, legend)
    heights = [height for _, height in rows]
    figure = Figure(figsize=(layout.width_in, sum(heights)), dpi=dpi)
    grid = figure.add_gridspec(len(rows), 1, height_ratios=heights, hspace=0, left=0, right=1, top=1, bottom=0)
    slot = {name: grid[index] for index, (name, _) in enumerate(rows) if name != "space"}
    _draw_padded(_row_axes(figure, slot["padded"], layout), padded, titles["padded"])
    flat_axes = _row_axes(figure, slot["flat"], layout)
    _draw_flattened(flat_axes, _row_axes(figure, slot["positions"], layout, sharex=flat_axes), flat, titles["flat"],
                    titles["positions"], layout.boundary_labels)
    if packed_rows is not None:
        # Other examples than the padded grid's: their colours continue after the first batch's.
        _draw_packed_rows(_row_axes(figure, slot["packed_rows"], layout), batches[packed_rows], config["max_length"],
                          titles["packed_rows"], first_color=len(lengths))
    for index, group in enumerate(groups):
        # room on the left for the first mask's tick and axis labels
        cells = _inset(slot[f"masks {index}"], MASK_LEFT_IN / layout.width_in, 0.97).subgridspec(
            1, layout.mask_columns, wspace=0.45)
        for cell, (panel, title, used_by, used_by_text) in zip(cells, group):
            _draw_mask(figure.add_subplot(cell), lengths, panel, title, used_by, used_by_text, layout.mask_ticks)
    figure.suptitle(titles["figure"], fontsize=FIGURE_TITLE_PT, x=0.01, y=1 - 0.15 / sum(heights), ha="left",
                    va="top")
    figure.legend(handles=legend, loc="lower center", ncols=layout.legend_columns, fontsize=LABEL_PT, frameon=False)
    return figure
