"""Numbers that must not contradict each other: each collator's ideal from its own batches, the history's best
speedup among like-for-like collators, and one peak memory per result, said in words, with what made it."""

from __future__ import annotations

import pytest
from test_timing import make_result

from demo_core import RunConfig, run_comparison
from demo_core.memory.measure import PhasePeaks, compared_moment, measured_peak
from demo_core.results import compare
from presentation.report import best_speedup


def test_each_collator_has_the_ideal_of_its_own_batches():
    # padded: 800 slots per 600 real tokens; padded-grouped still pads, less (620 slots); flatten pads nothing
    padded = make_result("padded", [1.0] * 6, [800] * 6, real=[600] * 6)
    grouped = make_result("padded-grouped", [0.8] * 6, [620] * 6, real=[600] * 6)
    flatten = make_result("flatten", [0.8] * 6, [600] * 6)
    comparison = compare([padded, grouped, flatten], ideal_speedup=800 / 600)
    assert comparison["padded"]["ideal_speedup"] == 1.0
    assert comparison["padded-grouped"]["ideal_speedup"] == pytest.approx(800 / 620)  # not padding's 1.00x
    assert comparison["flatten"]["ideal_speedup"] == pytest.approx(800 / 600)
    # the ratio to the ideal and the above-ideal flag follow the collator's own ideal
    assert comparison["padded-grouped"]["ratio_to_ideal"] == pytest.approx(
        comparison["padded-grouped"]["speedup_vs_padded"] / (800 / 620))
    assert "above-ideal" not in comparison["padded-grouped"]["flags"]


def test_history_best_speedup_is_among_like_for_like_collators_only():
    document = {"comparison": {"padded": {"speedup_vs_padded": 1.0}, "flatten": {"speedup_vs_padded": 1.6},
                               "trl-padding-free": {"speedup_vs_padded": 1.7},
                               "bfd": {"speedup_vs_padded": 2.4}, "naive-concat": {"speedup_vs_padded": 2.9},
                               "padded-grouped": {"speedup_vs_padded": 1.9}}}
    assert best_speedup(document) == 1.7
    assert best_speedup({"comparison": {"padded": {"speedup_vs_padded": 1.0},
                                        "bfd": {"speedup_vs_padded": 2.4}}}) is None


def test_a_cpu_result_has_one_peak_said_in_words_and_made_of_what_was_alive_then():
    comparison = run_comparison(RunConfig(model="tiny-llama", dataset="flan-like", samples=16, steps=2, batch_size=4,
                                          collators=("padded", "flatten"))).to_dict()
    for result in comparison["results"]:
        memory = result["memory"]
        assert result["peak_memory_bytes"] == memory["peak_bytes"] == sum(memory["measured_at_peak"].values())
        assert set(memory["measured_at_peak"]) == {"weights", "optimizer", "activations"}  # not the gradients
        assert result["peak_memory_kind"].startswith("sum of live tensor sizes at the end of the forward")
        assert memory["peak_kind"] == result["peak_memory_kind"]
        assert sum(memory["estimated_at_peak"].values()) == memory["estimated_peak_bytes"]
        # the chart's estimate is the one of the moment measured, the forward's end: no gradients, no temporaries
        assert memory["compared_moment"] == memory["peak_moment"] == "forward_end"
        assert set(memory["estimated_at_compared"]) == {"weights", "optimizer", "activations", "context"}
        # every category summed (the old chart's total) counts the gradients, never alive with the activations
        assert sum(v or 0 for v in memory["measured"].values()) > result["peak_memory_bytes"]


def test_a_cuda_peak_splits_into_what_is_held_and_what_the_allocator_held_beyond():
    peaks = PhasePeaks("cuda")  # a device name only: nothing here touches a GPU
    peaks.peaks = {"forward_end": 900, "backward_end": 1_000, "optimizer_step": 700}
    peak, moment, parts = measured_peak("cuda", {"weights": 300, "optimizer": 200, "activations": 450}, peaks)
    assert (peak, moment) == (1_000, "backward_end")
    assert parts == {"weights": 300, "optimizer": 200, "other": 500}
    assert compared_moment("cuda", moment) == "peak"  # the allocator's peak over the step: the estimate's peak
