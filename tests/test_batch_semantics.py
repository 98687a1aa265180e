"""Hugging Face's batch semantics: `--batch-size` is the per-device micro-batch, accumulation multiplies it, and every
result says its effective batch; a document saved before keeps the meaning it was trained with, and says so.

Earlier documents are today's with the two markers taken out (`batch_semantics`, `effective_batch_size`) and the
batch size as it was written then: the whole step's examples, split into micro-batches.
"""

import csv
import io

import pytest

from demo_core import RunConfig, prepare, run_comparison
from demo_core.batch_semantics import PER_DEVICE, batch_shape
from demo_core.training.duration import speed_key
from demo_core.training.trainers import training_arguments
from presentation import report
from presentation.batch_words import SAVED_BEFORE, batch_words
from presentation.recipe_script import with_code
from serving import provenance
from serving.inputs import config_from_document

pytestmark = pytest.mark.usefixtures("one_torch_thread")
RUN = RunConfig(samples=24, steps=3, batch_size=3, grad_accum=2, collators=("padded", "flatten"), max_length=256)


@pytest.fixture(scope="module")
def document() -> dict:
    return run_comparison(RUN).to_dict()


def saved_before(document: dict) -> dict:
    """The same run as a document from before: its batch size the step's 6 examples, in 2 micro-batches of 3."""
    config = {key: value for key, value in document["config"].items()
              if key not in ("batch_semantics", "effective_batch_size")}
    return {**document, "config": {**config, "batch_size": 6},
            "results": [{key: value for key, value in result.items() if key != "effective_batch_size"}
                        for result in document["results"]]}


def test_accumulation_multiplies_the_per_device_batch(document):
    prepared = prepare(RUN)
    # What every Hugging Face trainer is given: the micro-batch per device, and the accumulation.
    arguments = training_arguments(prepared.resolved, "unused")
    assert (arguments["per_device_train_batch_size"], arguments["gradient_accumulation_steps"]) == (3, 2)
    assert document["config"]["batch_semantics"] == PER_DEVICE and document["config"]["effective_batch_size"] == 6
    for result in document["results"]:
        assert result["effective_batch_size"] == 6, result["collator"]  # as the Trainer's arguments multiplied it
        assert result["step_examples"] == [6, 6, 6], result["collator"]
    # The preview's first batch is one forward: the micro-batch of 3.
    assert prepared.config.examples_per_step == 6
    assert "batch 3 per device × 2 accumulation = 6 per step" in report.format_report(document)
    assert report.results_table(document)[0][report.RESULT_HEADERS.index("effective batch")] == "6"


def test_no_divisibility_is_asked_any_more():
    # Before, accumulation had to divide the batch size; now any pair multiplies.
    assert RunConfig(batch_size=3, grad_accum=4).validated().examples_per_step == 12


def test_a_document_saved_before_keeps_its_meaning_and_says_so(document):
    old = saved_before(document)
    shape = batch_shape(old["config"])
    assert (shape.micro_batch_size, shape.grad_accum, shape.effective_batch_size, shape.saved_before) == (3, 2, 6, True)
    words = batch_words(old)
    assert words == f"batch 6 in 2 micro-batches of 3 ({SAVED_BEFORE})"
    assert words in report.format_report(old)
    # The history: the batch as saved, its effective batch, the words, the table's row.
    summary = report.run_summary("r1", "2026-12-01T00:00:00+00:00", old)
    assert (summary["batch_size"], summary["effective_batch_size"], summary["batch"]) == (6, 6, words)
    assert words in report.history_row(summary)
    assert report.results_table(old)[0][report.RESULT_HEADERS.index("effective batch")] == "6"
    # Its settings go back into the inputs (and redraw its batch) in today's meaning: the same steps again.
    assert {key: provenance.settings_of(old["config"])[key] for key in ("batch_size", "grad_accum")} == \
        {"batch_size": 3, "grad_accum": 2}
    assert (config_from_document(old).batch_size, config_from_document(old).grad_accum) == (3, 2)
    assert words in provenance.run_line(provenance.run_saved("r1", "2026-12-01T00:00:00+00:00", old))
    # Nothing changes its speed key: earlier runs still predict the time of today's.
    assert speed_key(old["config"]) == speed_key(document["config"])
    # It has no script: its settings would have trained another batch today.
    assert all(result["code"] is None for result in with_code(old)["results"])


def test_a_document_of_today_says_its_batch_only_where_it_multiplies(document):
    assert "Batch: batch 3 per device × 2 accumulation = 6 per step." in provenance.run_line(
        provenance.run_saved("r2", "2026-12-03T00:00:00+00:00", document))
    # The line over the batch picture and over a training run: the accumulation with the batch it makes.
    settings = provenance.settings_of(document["config"])
    assert "batch 3 · " in provenance.describe(settings) and "× 2 accumulation = 6 per step" in \
        provenance.preview_line(provenance.preview_shown(document["config"], {}), provenance.NO_RUN)
    assert "× 2 accumulation = 6 per step" in provenance.run_line(provenance.run_training(document["config"], 0, 2))
    plain = {**document, "config": {**document["config"], "grad_accum": 1, "effective_batch_size": 3}}
    assert batch_words(plain) == "batch 3" and "accumulation =" not in provenance.describe(
        provenance.settings_of(plain["config"]))
    assert "Batch:" not in provenance.run_line(provenance.run_saved("r3", "2026-12-03T00:00:00+00:00", plain))


def test_the_csv_carries_the_settings_of_every_row(document):
    rows = list(csv.DictReader(io.StringIO(report.results_csv(document))))
    assert [row["collator"] for row in rows] == ["padded", "flatten"]
    for row in rows:
        assert (row["config.batch_size"], row["config.grad_accum"], row["config.effective_batch_size"]) == \
            ("3", "2", "6")
        assert row["config.collators"] == "padded,flatten" and row["config.resolved_device"] == "cpu"
    old_rows = list(csv.DictReader(io.StringIO(report.results_csv(saved_before(document)))))
    assert old_rows[0]["config.effective_batch_size"] == "6" and "config.batch_semantics" not in old_rows[0]
