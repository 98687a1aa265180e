"""The presentation shared by the CLI and the page: one set of columns and sentences, human units, honest labels."""

import csv
import html
import io
import json
import re

import pytest

import demo_core
from presentation import batch_picture, headline, plots, report


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    # 7 lines of data asked as 256 samples: the run uses 7, and everything that reports it must say 7.
    data = tmp_path_factory.mktemp("data") / "seven.jsonl"
    data.write_text("".join(json.dumps({"text": f"example {i} " + "word " * (3 + 9 * i)}) + "\n" for i in range(7)))
    return demo_core.prepare(demo_core.RunConfig(dataset=str(data), samples=256, steps=5, batch_size=4,
                                                 max_length=128, collators=("padded", "flatten")))


@pytest.fixture(scope="module")
def document(prepared):
    return demo_core.run_comparison(prepared).to_dict()


def test_tables_show_memory_in_human_units_and_the_csv_keeps_raw_bytes(document):
    peak = document["results"][0]["peak_memory_bytes"]
    row = report.results_table(document)[0]
    assert row[report.RESULT_HEADERS.index("peak memory")] == f"{peak / 1e6:,.1f} MB"
    assert f"{peak:,}" not in " ".join(row)
    rows = list(csv.DictReader(io.StringIO(report.results_csv(document))))
    assert int(rows[0]["peak memory bytes"]) == peak


def test_cli_report_prints_the_page_tables_values(document):
    printed = report.format_report(document)
    terminal = [column for column in report.RESULT_COLUMNS if column.in_terminal]
    for result, shown in zip(document["results"], report.results_table(document)):
        line = next(line for line in printed.splitlines() if line.startswith(result["collator"]))
        for column in terminal:
            assert shown[report.RESULT_HEADERS.index(column.header)] in line


def test_saved_run_summary_counts_the_examples_the_run_used(document):
    summary = report.run_summary("abc", "2026-11-30T00:00:00+00:00", document)
    assert document["config"]["samples"] == 256 and summary["samples"] == 7
    assert report.history_row(summary)[report.HISTORY_HEADERS.index("samples")] == 7


def test_a_run_stopped_in_its_first_collator_says_so_instead_of_asking_for_collators(prepared):
    stopped = prepared.comparison([]).to_dict()
    text = headline.headline(stopped, headline.status_line(stopped))
    assert "Stopped before padded, flatten finished" in text
    assert "Add `padded`" not in text and "contamination check was skipped" in text


def test_the_preview_notes_say_why_for_every_collator_and_the_attention(prepared):
    preview = demo_core.preview(prepared)
    notes = report.collator_notes(preview)
    for name in ("padded", "flatten"):
        assert f"**{name}**: {demo_core.COLLATORS[name].why}" in notes
    assert f"**{preview['attention']} attention**" in notes and "7 examples" in report.cost_markdown(preview)


def test_loss_axis_shows_losses_not_an_offset_when_curves_coincide(document):
    # One step each, as float rounding leaves them (3e-7 apart): the axis range is tiny next to the loss.
    first_loss = document["results"][0]["losses"][0]
    one_step = {**document, "results": [{**result, "losses": [first_loss + 3e-7 * index]}
                                        for index, result in enumerate(document["results"])]}
    figure = plots.loss_figure(one_step)
    figure.canvas.draw()
    shown = [float(label.get_text().replace("−", "-")) for label in figure.axes[0].get_yticklabels()
             if label.get_text()]
    # The tick labels are the losses themselves, not multiples of 1e-7 above an offset printed in a corner.
    assert shown and all(abs(value - first_loss) < 1e-3 for value in shown), shown


def test_batch_title_counts_the_examples_drawn(prepared):
    preview = demo_core.preview(prepared)
    figure = batch_picture.batch_figure(preview)
    texts = "\n".join(t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text")))
    assert "The first batch (4 examples)" in texts


def test_human_bytes():
    assert [report.human_bytes(n) for n in (999, 117_321_932, 80e9)] == ["999 B", "117.3 MB", "80.0 GB"]


def test_the_details_put_each_collators_why_and_colour_next_to_its_numbers(document, prepared):
    attention_why = demo_core.preview(prepared)["attention_why"]
    lines = headline.detail_markdown(document, attention_why).splitlines()
    for result in document["results"]:
        spec = demo_core.COLLATORS[result["collator"]]
        [line] = [line for line in lines if f"**{spec.name}**" in line]
        assert f"background:{spec.color}" in line and spec.why in line  # swatch, numbers and why on one line
    flatten = document["comparison"]["flatten"]
    assert any(f"{flatten['speedup_vs_padded']:.2f}× the padded throughput" in line for line in lines)
    assert f"**{document['config']['resolved_attention']} attention**: *{attention_why}*" in lines[-1]


def _numbers_of(card: str) -> list[str]:
    return re.findall(r'class="glance-number">([^<]+)<', card)


def test_the_headline_shows_speed_memory_and_loss_of_each_packed_collator_big(document):
    text = headline.headline(document, headline.status_line(document, 12.3))
    assert text.startswith("### Done in 12.3 s")
    [card] = re.findall(r'<div class="glance-card">.*?</div></div></div>', text)  # flatten's: padded is the baseline
    flatten, padded = document["comparison"]["flatten"], document["results"][0]
    memory_change = f"{flatten['peak_memory_vs_padded']:+.0%}".replace("-", "−")
    assert _numbers_of(card) == [f"{flatten['speedup_vs_padded']:.2f}×", memory_change,
                                 headline.loss_number(flatten["max_abs_loss_diff_vs_padded"])]
    assert f"ideal {flatten['ideal_speedup']:.2f}×" in card and "identical" in card
    # The peak is the one the results table shows, and what it measures on this device is said in words.
    assert report.human_bytes(padded["peak_memory_bytes"]) in text and padded["peak_memory_kind"] in text


def test_a_slower_collator_reads_slower_and_seven_collators_make_a_compact_table(document):
    flatten = {**document["comparison"]["flatten"], "speedup_vs_padded": 0.58, "flags": []}  # no caveat: the plain words
    slower = {**document, "comparison": {**document["comparison"], "flatten": flatten}}
    words = html.unescape(headline.numbers(slower))
    assert "0.58×" in words and "speed vs padded: </span>slower" in words and "faster" not in words
    padded, packed = document["results"]
    many = {**document, "results": [padded] + [packed] * 6}  # six packed collators beside padded: a row each
    text = headline.numbers(many)
    assert 'class="glance-table"' in text and 'class="glance-card"' not in text
    assert text.count("<tr>") == 1 + 6


def test_a_number_a_flag_distrusts_shows_its_caveat_and_a_higher_peak_says_why(document):
    padded, packed = document["results"]
    flatten = {**document["comparison"]["flatten"], "flags": ["noisy"], "speedup_range": [1.21, 3.04],
               "peak_memory_vs_padded": 0.9}
    bigger = {**packed, "peak_memory_bytes": padded["peak_memory_bytes"] * 1.9,
              "padded_slots": padded["padded_slots"] * 2, "steps": padded["steps"]}
    flagged = {**document, "results": [padded, bigger],
               "comparison": {**document["comparison"], "flatten": flatten}}
    [card] = re.findall(r'<div class="glance-card">.*?</div></div></div>', html.unescape(headline.numbers(flagged)))
    assert "noisy, 1.21–3.04×: run again" in card
    assert "its steps hold 2.0× the token slots" in card
    above = {**flatten, "flags": ["above-ideal"]}
    words = html.unescape(headline.numbers({**document, "comparison": {**document["comparison"], "flatten": above}}))
    assert f"above the ideal {flatten['ideal_speedup']:.2f}×" in words
    assert headline.loss_number(9.5367e-07) == "9.5e-7" and headline.loss_number(0.116) == "1.2e-1"


def test_a_stopped_runs_empty_contamination_table_says_why(prepared, document):
    stopped = prepared.comparison([]).to_dict()
    assert stopped["contamination"] == [] and "not checked, the run stopped" in report.contamination_title(stopped)
    assert report.contamination_title(document) == report.CONTAMINATION_TITLE  # a complete run shows its rows


def test_tables_put_the_key_columns_first():
    # A phone shows the first few columns of a table; the rest scroll sideways.
    assert report.RESULT_HEADERS[:5] == ["collator", "speedup vs padded", "ideal speedup", "max |Δloss| vs padded",
                                         "peak memory"]
    assert report.HISTORY_HEADERS[:3] == ["run id", "best speedup", "status"]


def test_before_run_the_cost_table_predicts_time_and_memory_and_warns_when_long_or_too_big(prepared):
    preview = demo_core.preview(prepared)
    predicted, memory = preview["predicted"], preview["memory_guard"]
    text = report.cost_markdown(preview)
    assert f"about {report.human_seconds(predicted['duration_s'])}" in text and "⚠" not in text
    peak, available = (report.human_bytes(memory[key]) for key in ("predicted_peak_bytes", "available_bytes"))
    assert f"**{peak}** of {available} available: fits" in text
    too_much = {**preview, "predicted": {**predicted, "duration_s": 5400.0, "long": True},
                "memory_guard": {**memory, "fits": False}}
    warned = report.cost_markdown(too_much)
    assert "about 1.5 h** ⚠ long" in warned and "⚠ does not fit: Run would be refused" in warned


@pytest.mark.parametrize("basis, words", [("parameters", "from the parameter count"),
                                          ("history", "from earlier runs"), ("model", "by the step-time model")])
def test_the_cost_table_says_where_the_predicted_time_comes_from(prepared, basis, words):
    preview = demo_core.preview(prepared)
    text = report.cost_markdown({**preview, "predicted": {**preview["predicted"], "basis": basis}})
    assert f"predicted time of the run, {words}" in text
