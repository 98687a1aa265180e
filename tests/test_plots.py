"""Figures from a real small run: every number drawn is checked against the document or preview it came from."""

import io

import matplotlib.colors
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import demo_core
from presentation import batch_picture, plots
from figure_checks import PHONE_IN, cut_off, drawn_texts

# 5 steps: step 1 is warm-up and step 2 profiled, so 3 are timed, the fewest that give a speedup.
CONFIG = demo_core.RunConfig(samples=32, steps=5, batch_size=4, max_length=256,
                             collators=("padded", "flatten", "naive-concat", "bfd"))


@pytest.fixture(scope="module")
def document():
    return demo_core.run_comparison(CONFIG).to_dict()


@pytest.fixture(scope="module")
def preview():
    return demo_core.preview(CONFIG)


def _texts(figure: Figure) -> str:
    return "\n".join(text.get_text() for text in figure.findobj(lambda artist: hasattr(artist, "get_text")))


def _renders(figure: Figure) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="webp")  # what gr.Plot does with a matplotlib figure
    assert buffer.tell() > 1000


def test_batch_figure_labels_the_engine_numbers(preview):
    figure = batch_picture.batch_figure(preview)
    _renders(figure)
    texts = _texts(figure)
    flat, padded, bfd = (preview["batches"][name] for name in ("flatten", "padded", "bfd"))
    for boundary in flat["cu_seqlens"]:
        assert f"\n{boundary}\n" in texts  # every cu_seqlens value of a small batch is written at its boundary
    assert f"{padded['pad_fraction']:.0%} of the compute is padding" in texts
    assert f"1 row × {bfd['real_tokens']:,} tokens" in texts
    for score_key in ("attention_scores_padded", "attention_scores_dense_packed", "attention_scores_varlen"):
        assert f"{preview['cost'][score_key]:,} scores" in texts
    assert "used by flatten, bfd in this run" in texts  # varlen attention on CPU: the block-only panel
    assert "used by naive-concat in this run" in texts


def test_mask_images_compute_what_each_path_computes(preview):
    lengths = sorted(preview["lengths"])[:3]  # the shortest examples of the run
    total = sum(lengths)
    assert total <= batch_picture.MASK_PIXELS  # one pixel per token, so cells can be counted exactly
    causal_pairs = sum(n * (n + 1) // 2 for n in lengths)
    varlen = batch_picture._mask_image(lengths, "varlen")
    naive = batch_picture._mask_image(lengths, "naive")
    dense = batch_picture._mask_image(lengths, "dense")
    assert (varlen >= 2).sum() == (naive >= 2).sum() == (dense >= 2).sum() == causal_pairs
    assert (varlen == batch_picture.MASKED).sum() == 0  # varlen computes nothing it throws away
    assert (dense == batch_picture.NOT_COMPUTED).sum() == 0  # the dense mask computes all T x T scores
    assert (naive == batch_picture.LEAK).sum() == total * (total + 1) // 2 - causal_pairs
    padded = batch_picture._mask_image(lengths, "padded")
    assert (padded != batch_picture.NOT_COMPUTED).sum() == len(lengths) * max(lengths) ** 2


def test_lengths_figure_counts_every_example(preview):
    figure = plots.lengths_figure(preview)
    _renders(figure)
    heights = sum(patch.get_height() for patch in figure.axes[0].patches)
    assert heights == len(preview["lengths"]) == preview["dataset_stats"]["count"]


def test_throughput_figure_draws_tokens_per_s_and_speedups(document):
    figure = plots.throughput_figure(document)
    _renders(figure)
    bars = [patch.get_height() for patch in figure.axes[0].patches]
    assert bars == pytest.approx([result["tokens_per_s"] for result in document["results"]])
    texts = _texts(figure)
    for name, entry in document["comparison"].items():
        assert f"{entry['speedup_vs_padded']:.2f}×" in texts
    assert f"ideal {document['ideal_speedup']:.2f}×" in texts
    for name, entry in document["comparison"].items():
        if name != "padded":
            assert f"work ideal {entry['work_ideal_speedup']:.2f}×" in texts


def test_anatomy_figure_stacks_each_collators_profiled_step(document):
    figure = plots.anatomy_figure(document)
    _renders(figure)
    by_phase, by_operation = figure.axes
    results = document["results"]
    for axes, part in ((by_phase, "phases"), (by_operation, "ops")):
        heights = {}
        for patch in axes.patches:
            position = round(patch.get_x() + patch.get_width() / 2)
            heights[position] = heights.get(position, 0.0) + patch.get_height()
        assert [heights[index] for index in range(len(results))] == pytest.approx(
            [sum(result["time_anatomy"][part].values()) * 1000 for result in results])
    phases = results[0]["time_anatomy"]["phases"]
    assert f"bwd/fwd {phases['backward'] / phases['forward']:.1f}×" in _texts(figure)
    none_profiled = {**document, "results": [{**result, "time_anatomy": None} for result in results]}
    assert "no step was profiled" in _texts(plots.anatomy_figure(none_profiled))


def test_loss_figure_draws_every_step_of_every_collator(document):
    figure = plots.loss_figure(document)
    _renders(figure)
    lines = figure.axes[0].get_lines()
    assert [list(line.get_ydata()) for line in lines] == [result["losses"] for result in document["results"]]
    assert len({line.get_linestyle() for line in lines}) == len(lines)  # identical curves stay distinguishable


def test_memory_figure_stacks_estimate_and_measured_or_says_why_not(document):
    figure = plots.memory_figure(document)
    _renders(figure)
    texts = _texts(figure)
    bars = figure.axes[0].patches
    for index, result in enumerate(document["results"]):
        memory = result["memory"]
        measured = {category: value for category, value in memory["measured"].items() if value is not None}
        # Each collator's hatched bar stacks its estimate, its solid bar what was measured, centred on its tick.
        estimate_height = sum(bar.get_height() for bar in bars
                              if bar.get_hatch() and abs(bar.get_x() + bar.get_width() / 2 - (index - 0.2)) < 1e-6)
        assert estimate_height == pytest.approx(sum(memory["estimate"].values()) / 1e6)
        assert f"{sum(measured.values()) / 1e6:,.1f} MB" in texts
        error = sum(memory["estimate"][category] for category in measured) / sum(measured.values()) - 1
        assert f"est. {error:+.0%}*" in texts
    assert "temporary not measurable here" in texts  # the unmeasured category is named, not silently dropped
    empty = {**document, "results": [{**result, "memory": {}} for result in document["results"]]}
    assert "not available" in _texts(plots.memory_figure(empty))


def test_results_figures_draw_a_run_in_progress(document):
    """The app redraws after each collator: a document with only the first result must draw."""
    first = {**document, "results": document["results"][:1], "partial": True}
    for draw in (plots.throughput_figure, plots.loss_figure, plots.memory_figure, plots.anatomy_figure):
        _renders(draw(first))
    assert np.isclose(plots.throughput_figure(first).axes[0].patches[0].get_height(),
                      document["results"][0]["tokens_per_s"])


# ---- readable with every collator, on a desktop and on a phone ----------------------------------------------------

EVERY_COLLATOR = demo_core.RunConfig(samples=8, steps=2, batch_size=2, max_length=128,
                                     collators=tuple(demo_core.COLLATORS))


@pytest.fixture(scope="module")
def every_collator():
    prepared = demo_core.prepare(EVERY_COLLATOR)
    return demo_core.preview(prepared), demo_core.run_comparison(prepared).to_dict()


@pytest.mark.parametrize("width_in", [PHONE_IN, 9, batch_picture.BATCH_MAX_IN])
def test_the_batch_picture_keeps_every_text_inside_and_readable_at_any_width(every_collator, width_in):
    preview, _ = every_collator
    figure = batch_picture.batch_figure(preview, width_in)
    assert figure.get_size_inches()[0] == pytest.approx(width_in)
    assert cut_off(figure) == []
    # The page shows a figure at FIGURE_DPI CSS pixels per inch, so a p-point text is ~1.1 p pixels high.
    assert min(text.get_fontsize() for text in drawn_texts(figure)) >= batch_picture.SMALL_PT
    texts = _texts(figure)
    assert "trl-bfd" in texts and "used by" in texts  # the packed rows and every mask's users are drawn


@pytest.mark.parametrize("width_in", [PHONE_IN, plots.RESULT_WIDTH_IN])
def test_results_figures_keep_every_text_inside_with_every_collator(every_collator, width_in):
    _, document = every_collator
    for draw in (plots.throughput_figure, plots.loss_figure, plots.memory_figure, plots.anatomy_figure):
        figure = draw(document, width_in)
        assert cut_off(figure) == [], draw.__name__
    loss = plots.loss_figure(document, width_in)
    FigureCanvasAgg(loss).draw()
    [legend] = loss.legends  # seven collators' names below the curves, not over them
    assert not legend.get_window_extent().overlaps(loss.axes[0].get_window_extent())
    assert len(legend.get_texts()) == len(demo_core.COLLATORS)
    colours = {matplotlib.colors.to_hex(patch.get_facecolor())
               for patch in plots.throughput_figure(document, width_in).axes[0].patches}
    assert len(colours) == len(demo_core.COLLATORS)  # trl-padding-free and trl-bfd are told apart too
