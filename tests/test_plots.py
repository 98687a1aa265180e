"""Figures from a real small run: every number drawn is checked against the document or preview it came from."""

import io
import json

import matplotlib.colors
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation

import demo_core
from presentation import batch_picture, plots
from presentation.report import human_bytes

from figure_checks import PHONE_IN, cut_off, drawn_texts, overlapping

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


def _no_loss_marked(figure: Figure) -> list[int]:
    """Per panel that marks any, from the top: how many token slots the figure hatches as carrying no loss."""
    marked = []
    for axes in figure.axes:
        spans = [path.get_extents().width for collection in axes.collections
                 if collection.get_gid() == batch_picture.NO_LOSS_GID for path in collection.get_paths()]
        if spans:
            marked.append(round(sum(spans)))
    return marked


def _masked_beyond_starts(labels: list[int], lengths: list[int]) -> int:
    """-100 labels of a flattened row that are not an example's first (those are -100 whatever the loss)."""
    starts = set(np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist())
    return sum(1 for index, label in enumerate(labels) if label == -100 and index not in starts)


PROMPT_COMPLETION = [{"prompt": f"Question {i}: what is {i} plus {i}?",
                      "completion": f" It is {2 * i}. " + "Check it twice. " * (1 + i % 4)} for i in range(12)]
CHAT = [{"messages": [{"role": "user", "content": f"What is {i} plus {i}? " + "Think. " * (i % 3)},
                      {"role": "assistant", "content": f"It is {2 * i}." + " Sure." * (i % 4)}]} for i in range(12)]


@pytest.mark.parametrize("rows, loss_on", [(PROMPT_COMPLETION, "auto"), (CHAT, "assistant")])
def test_batch_figure_hatches_exactly_the_tokens_the_collated_labels_mask(tmp_path, rows, loss_on):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    masked = demo_core.preview(demo_core.RunConfig(dataset=str(data), samples=12, steps=2, batch_size=4,
                                                   max_length=128, collators=("padded", "flatten", "bfd"),
                                                   loss_on=loss_on))
    assert masked["dataset_stats"]["loss_on"] in ("completion", "assistant")
    figure = batch_picture.batch_figure(masked)
    _renders(figure)
    padded, flat, bfd = (masked["batches"][name] for name in ("padded", "flatten", "bfd"))
    # The padded rows: -100 among each example's real tokens past its first (padding is -100 too, drawn grey).
    padded_masked = sum(_masked_beyond_starts(row[:length], [length])
                        for row, length in zip(padded["labels"], padded["lengths"]))
    flat_masked = _masked_beyond_starts(flat["labels"][0], flat["lengths"])
    bfd_masked = _masked_beyond_starts(bfd["labels"][0], bfd["lengths"])
    assert 0 < flat_masked == padded_masked  # the same examples, the same prompts
    assert _no_loss_marked(figure) == [padded_masked, flat_masked, bfd_masked]
    texts = _texts(figure)
    assert "no loss (prompt, masked -100)" in texts
    assert f"the {flat_masked:,} of {flat['cu_seqlens'][-1]:,} tokens with no loss" in texts
    # The boundaries keep their own mark, one ▲ per example start, apart from the hatching.
    [triangles] = [line for axes in figure.axes for line in axes.get_lines() if line.get_marker() == "^"]
    assert list(triangles.get_xdata()) == flat["cu_seqlens"][:-1]
    phone = batch_picture.batch_figure(masked, PHONE_IN)  # the longer title and legend still fit a phone
    assert cut_off(phone) == [] and overlapping(phone) == []


def test_batch_figure_hatches_the_collated_labels_in_the_rows_it_draws_for_a_collator_not_run(tmp_path):
    """Without padded and flatten in the run, the grid and the row it draws for them carry naive-concat's labels."""
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in CHAT))
    masked = demo_core.preview(demo_core.RunConfig(dataset=str(data), samples=12, steps=2, batch_size=4,
                                                   max_length=128, collators=("naive-concat",), loss_on="assistant"))
    naive = masked["batches"]["naive-concat"]
    expected = _masked_beyond_starts(naive["labels"][0], naive["lengths"])
    assert expected > 0
    assert _no_loss_marked(batch_picture.batch_figure(masked)) == [expected, expected]


def test_batch_figure_of_a_loss_on_every_token_hatches_nothing(preview):
    assert preview["dataset_stats"]["loss_on"] == "all"
    figure = batch_picture.batch_figure(preview)
    assert _no_loss_marked(figure) == []
    assert "no loss (prompt, masked -100)" not in _texts(figure)


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
    # The y axis ends where the tallest bar's label does (not 30% above it for a legend); the legends are under the
    # panels, over no bar.
    tallest = max(result["time_anatomy"]["step_s"] for result in results) * 1000
    assert tallest < by_phase.get_ylim()[1] < 1.2 * tallest
    for legend, axes in zip((legend for panel in figure.subfigs for legend in panel.legends), figure.axes):
        assert legend.get_window_extent().y1 < axes.get_window_extent().y0
    none_profiled = {**document, "results": [{**result, "time_anatomy": None} for result in results]}
    assert "no step was profiled" in _texts(plots.anatomy_figure(none_profiled))


def test_loss_figure_draws_every_step_of_every_collator(document):
    figure = plots.loss_figure(document)
    _renders(figure)
    lines = figure.axes[0].get_lines()
    assert [list(line.get_ydata()) for line in lines] == [result["losses"] for result in document["results"]]
    assert len({line.get_linestyle() for line in lines}) == len(lines)  # identical curves stay distinguishable


def _memory_heights(figure: Figure, index: int) -> tuple[float, float]:
    """The heights of collator `index`'s estimate (hatched, left) and measured (solid, right) stacks, in MB."""
    bars = figure.axes[0].patches
    return tuple(sum(bar.get_height() for bar in bars if bool(bar.get_hatch()) == hatched
                     and abs(bar.get_x() + bar.get_width() / 2 - (index + offset)) < 1e-6)
                 for offset, hatched in ((-0.2, True), (0.2, False)))


def _labels_over(figure: Figure, index: int) -> list[str]:
    """The labels over collator `index`'s pair of bars, from the bottom up, their lines joined by spaces."""
    return [" ".join(text.get_text().split()) for text in figure.axes[0].texts
            if isinstance(text, Annotation) and text.xy[0] == index]


@pytest.mark.parametrize("width_in", [PHONE_IN, plots.RESULT_WIDTH_IN])
def test_memory_figure_stacks_what_was_alive_at_each_peak_labelled_as_the_table(document, width_in):
    figure = plots.memory_figure(document, width_in)
    _renders(figure)
    for index, result in enumerate(document["results"]):
        memory = result["memory"]
        # The bars stack only what was alive together, both sides at one moment: on a CPU the end of the forward.
        assert memory["compared_moment"] == memory["peak_moment"] == "forward_end"
        estimated = sum(memory["estimated_at_compared"].values())
        assert _memory_heights(figure, index) == pytest.approx((estimated / 1e6, result["peak_memory_bytes"] / 1e6))
        assert sum(memory["measured_at_peak"].values()) == memory["peak_bytes"] == result["peak_memory_bytes"]
        # The label is the results table's peak memory, as the table writes it, then the estimate's error.
        error = f"est. {estimated / result['peak_memory_bytes'] - 1:+.0%}"
        assert _labels_over(figure, index) == [human_bytes(result["peak_memory_bytes"]), error]
    # What the measurement is on this device, in words: a CPU's is a sum of tensor sizes, not an allocator reading
    # (the whole sentence, why, is in the headline).
    kind = document["results"][0]["memory"]["peak_kind"]
    assert "no allocator peak" in kind
    texts = " ".join(_texts(figure).split())
    assert "measured: sum of live tensor sizes at the end of the forward" in texts
    assert "alive at the end of a training step's forward" in texts and "at the same moment" in texts


def _memory_segments(figure: Figure, index: int, category: str) -> tuple[float, float]:
    """The heights of one category's segments in collator `index`'s estimate and measured stacks, in MB."""
    color = matplotlib.colors.to_rgba(plots.MEMORY_CATEGORY_COLORS[category])
    bars = [bar for bar in figure.axes[0].patches if bar.get_facecolor() == color]
    return tuple(sum(bar.get_height() for bar in bars if bool(bar.get_hatch()) == hatched
                     and abs(bar.get_x() + bar.get_width() / 2 - (index + offset)) < 1e-6)
                 for offset, hatched in ((-0.2, True), (0.2, False)))


# Measured on tiny-llama, LoRA r8 with checkpointing, 2 steps of 4 flan-like examples: the activations and the whole
# stacks agree to 4 bytes of ~1.4-6.1 MB (the meter's scalars around the loss); the estimate's own peak, at the
# recomputed layer's backward, read +402% and +275% against the forward's end. 2% leaves room for other seeds.
SAME_MOMENT_TOLERANCE = 0.02


def test_memory_figure_compares_estimate_and_measurement_at_the_same_moment_with_lora_and_checkpointing():
    document = demo_core.run_comparison(demo_core.RunConfig(model="tiny-llama", dataset="flan-like", samples=24,
                                                            steps=2, batch_size=4, lora_rank=8,
                                                            collators=("padded", "flatten"))).to_dict()
    assert document["config"]["resolved_gradient_checkpointing"]  # on for LoRA
    figure = plots.memory_figure(document)
    for index, result in enumerate(document["results"]):
        assert result["memory"]["estimated_peak_moment"] == "backward_recompute"  # not the moment measured
        for estimated_mb, measured_mb in (_memory_segments(figure, index, "activations"),
                                          _memory_heights(figure, index)):
            assert measured_mb > 0
            assert abs(estimated_mb / measured_mb - 1) <= SAME_MOMENT_TOLERANCE, result["collator"]
        assert _memory_segments(figure, index, "temporary") == (0, 0)  # no temporaries at the forward's end
    assert "at the end of a training step's forward" in " ".join(_texts(figure).split())


def test_memory_figure_of_a_document_saved_before_one_peak_stacks_every_category_or_says_why_not(document):
    new_keys = ("peak_kind", "measured_at_peak", "estimated_peak_bytes", "estimated_peak_moment", "estimated_at_peak",
                "compared_moment", "estimated_at_compared")
    saved = {**document, "results": [{**result, "memory": {key: value for key, value in result["memory"].items()
                                                           if key not in new_keys}}
                                     for result in document["results"]]}
    figure = plots.memory_figure(saved)
    _renders(figure)
    texts = _texts(figure)
    for index, result in enumerate(document["results"]):
        memory = result["memory"]
        measured = {category: value for category, value in memory["measured"].items() if value is not None}
        assert _memory_heights(figure, index) == pytest.approx(
            (sum(memory["estimate"].values()) / 1e6, sum(measured.values()) / 1e6))
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

# 5 steps, as CONFIG: speedups and work ideals to label, the labels that crowd a figure with seven bars.
EVERY_COLLATOR = demo_core.RunConfig(samples=8, steps=5, batch_size=2, max_length=128,
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
    assert overlapping(figure) == []
    # The page shows a figure at FIGURE_DPI CSS pixels per inch, so a p-point text is ~1.1 p pixels high.
    assert min(text.get_fontsize() for text in drawn_texts(figure)) >= batch_picture.SMALL_PT
    texts = _texts(figure)
    assert "trl-bfd" in texts and "used by" in texts  # the packed rows and every mask's users are drawn


RESULT_FIGURES = (plots.throughput_figure, plots.loss_figure, plots.memory_figure, plots.anatomy_figure)


@pytest.fixture(scope="module")
def two_collators(document):
    """The page's figures once the second collator of a run has finished: its first two results."""
    return {**document, "results": document["results"][:2]}


@pytest.mark.parametrize("width_in", [PHONE_IN, plots.RESULT_WIDTH_IN, plots.ANATOMY_WIDTH_IN])
@pytest.mark.parametrize("run", ["two_collators", "every_collator"])
def test_results_figures_draw_no_text_over_another_nor_past_the_edge(run, width_in, request):
    """On a phone and a desktop, with two collators and with all seven: every label readable and inside."""
    document = request.getfixturevalue(run)
    document = document[1] if run == "every_collator" else document
    # The page shows the run's figures at most RESULT_WIDTH_IN wide, the anatomy's two panels up to ANATOMY_WIDTH_IN.
    for draw in RESULT_FIGURES if width_in <= plots.RESULT_WIDTH_IN else (plots.anatomy_figure,):
        figure = draw(document, width_in)
        assert overlapping(figure) == [], draw.__name__
        assert cut_off(figure) == [], draw.__name__


@pytest.mark.parametrize("width_in", [PHONE_IN, plots.RESULT_WIDTH_IN])
def test_results_figures_tell_every_collator_apart(every_collator, width_in):
    _, document = every_collator
    loss = plots.loss_figure(document, width_in)
    FigureCanvasAgg(loss).draw()
    [legend] = loss.legends  # seven collators' names below the curves, not over them
    assert not legend.get_window_extent().overlaps(loss.axes[0].get_window_extent())
    assert len(legend.get_texts()) == len(demo_core.COLLATORS)
    colours = {matplotlib.colors.to_hex(patch.get_facecolor())
               for patch in plots.throughput_figure(document, width_in).axes[0].patches}
    assert len(colours) == len(demo_core.COLLATORS)  # trl-padding-free and trl-bfd are told apart too
