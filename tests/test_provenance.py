"""The lines that say which settings the page's two sections show, and when they disagree."""

import demo_core
from serving import provenance

RUN_CONFIG = {**demo_core.RunConfig(samples=64, collators=("padded", "flatten")).to_dict(), "resolved_attention": "x"}
# The page's raw widget values by setting name, and its upload box.
INPUTS = {"model": "tiny-llama", "dataset": "flan-like", "samples": 64, "collators": ["padded", "flatten"], "steps": 20,
          "batch_size": 8, "attention": "auto", "precision": "auto", "optimizer": "adamw", "seed": 0, "max_length": 1024,
          "upload": None}


def saved_run(config=RUN_CONFIG):
    return provenance.run_saved("abc123", "2026-11-30T06:00:00+00:00", {"config": config, "partial": False})


def test_a_picture_of_other_settings_than_the_results_says_which_differ():
    picture = provenance.preview_shown({**RUN_CONFIG, "dataset": "orcamath-like", "samples": 256}, INPUTS)
    above, below = provenance.lines(picture, saved_run())
    assert "**Not the settings of the results above** (run **abc123**)" in above
    assert "dataset orcamath-like there" not in above  # "there" is the run, "here" the picture
    assert "dataset flan-like there, orcamath-like here" in above and "samples 64 there, 256 here" in above
    assert "run **abc123** (complete, saved 2026-11-30 06:00:00 UTC)" in below


def test_the_same_settings_above_and_below_raise_no_flag():
    above, _ = provenance.lines(provenance.preview_shown(RUN_CONFIG, INPUTS), saved_run())
    assert above.startswith("**Shown:** the first batch of `tiny-llama` · `flan-like` · 64 samples")
    assert "⚠" not in above


def test_a_failed_preview_says_the_picture_is_still_the_previous_one_and_is_not_retried():
    shown = provenance.preview_shown(RUN_CONFIG, INPUTS)
    bad = {**INPUTS, "model": "gpt2"}
    failed = provenance.preview_failed(shown, bad)
    above, _ = provenance.lines(failed, provenance.NO_RUN)
    assert "could not be drawn" in above and "64 samples" in above
    assert provenance.is_shown(failed, bad) and provenance.is_shown(failed, INPUTS)  # a blur does not redraw either
    assert not provenance.is_shown(failed, {**INPUTS, "model": "tiny-qwen2"})
    assert not provenance.is_shown(None, INPUTS)
    nothing_yet = provenance.preview_failed(None, bad)  # the page's first preview failed: there is no picture
    assert "no batch is shown" in provenance.lines(nothing_yet, saved_run())[0]
    assert provenance.is_shown(nothing_yet, bad) and not provenance.is_shown(nothing_yet, INPUTS)


def test_the_results_line_follows_a_run_from_click_to_saved():
    assert "No run shown yet" in provenance.run_line(provenance.NO_RUN)
    assert "previous results were cleared" in provenance.run_line(provenance.run_started())
    assert "could not start" in provenance.run_line(provenance.run_failed(provenance.run_started()))
    training = provenance.run_training(RUN_CONFIG, 1, 2)
    assert "**Training** (1 of 2 collators done" in provenance.run_line(training)
    assert "**The run failed**" in provenance.run_line(provenance.run_failed(training))
    during, _ = provenance.lines(provenance.preview_shown({**RUN_CONFIG, "steps": 5}, INPUTS), training)
    assert "(the run): steps 20 there, 5 here" in during
