"""What a run does about memory before and while it trains, and a contamination check that never reads as clean
when it compared nothing.

The free memory the guard reads (psutil's available RAM, CUDA's free memory) is the one boundary replaced here: a
test cannot make this machine small. The prediction, the search for what fits and the refusal run for real.
"""

import json
import re

import pytest

from commandline import main as cli
from demo_core import RunConfig, prepare, preview
from demo_core.attention.contamination import contamination_check
from demo_core.models.sources import load_model_source
from demo_core.training import engine, memory_guard
from demo_core.training.trainers import RecordingTrainer
from presentation import report

SMALL = dict(model="tiny-llama", dataset="flan-like", samples=16, collators=("padded", "flatten"), steps=3,
             batch_size=4, max_length=512)
SMALL_ARGUMENTS = ["compare", "--model", "tiny-llama", "--samples", "16", "--collators", "padded,flatten",
                   "--steps", "3", "--batch-size", "4", "--max-length", "512"]
FREE_BYTES = memory_guard.CPU_RUN_ALLOWANCE_BYTES + 30_000_000  # 30 MB more than a CPU run adds besides its tensors


def test_a_run_that_cannot_fit_is_refused_before_it_trains_with_the_estimate_and_what_fits(monkeypatch, capsys):
    monkeypatch.setattr(memory_guard, "available_bytes", lambda device: FREE_BYTES)
    monkeypatch.setattr(engine, "run_burst", lambda *args, **kwargs: pytest.fail("a refused run trained"))
    assert cli.main(SMALL_ARGUMENTS) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "Traceback" not in error
    assert error.startswith("error: this run needs about ")
    assert f"more than the {FREE_BYTES / 1e9:.1f} GB this machine has available" in error
    assert "the 2 collators take turns" in error
    # The largest max length it names fits, and one token more does not.
    longest = int(re.search(r"max length ([\d,]+) \(at batch size 4\)", error)[1].replace(",", ""))
    prepared = prepare(RunConfig(**SMALL))
    assert memory_guard.predict(prepared, max_length=longest).predicted_peak_bytes <= FREE_BYTES
    assert memory_guard.predict(prepared, max_length=longest + 1).predicted_peak_bytes > FREE_BYTES


def test_the_preview_predicts_the_runs_peak_and_the_free_memory_before_run():
    guard = preview(RunConfig(**{**SMALL, "collators": ("padded", "flatten", "naive-concat")}))["memory_guard"]
    assert guard["fits"] is True and guard["available_bytes"] > guard["predicted_peak_bytes"] > 0
    padded, flatten, naive = guard["collators"]
    # On a CPU the bursts take turns and each thread keeps its step's memory: every collator's counts at once.
    assert guard["collators_resident_together"]
    assert guard["predicted_peak_bytes"] == (sum(c["tensor_peak_bytes"] for c in guard["collators"])
                                             + naive["mask_check_bytes"] + memory_guard.CPU_RUN_ALLOWANCE_BYTES)
    # varlen checks the model's mask on every token pair of a segment: naive-concat's one row has them all.
    assert naive["mask_check_bytes"] == memory_guard.MASK_CHECK_BYTES_PER_PAIR * naive["worst_batch_tokens"] ** 2
    assert flatten["mask_check_bytes"] < naive["mask_check_bytes"] / 2


def test_a_step_that_runs_out_of_memory_ends_its_burst_as_partial_with_the_reason(monkeypatch, tmp_path, capsys):
    real_training_step, steps = RecordingTrainer.training_step, {}

    def allocator_refuses_naive_concat_step_2(self, model, inputs, num_items_in_batch=None):
        name = type(self.data_collator).__name__
        steps[name] = steps.get(name, 0) + 1
        if name == "NaiveConcatCollator" and steps[name] == 2:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 34359738368 bytes. "
                               "Error code 12 (Cannot allocate memory)")
        return real_training_step(self, model, inputs, num_items_in_batch)

    monkeypatch.setattr(RecordingTrainer, "training_step", allocator_refuses_naive_concat_step_2)
    path = tmp_path / "run.json"
    assert cli.main([*SMALL_ARGUMENTS[:6], "padded,flatten,naive-concat", *SMALL_ARGUMENTS[7:], "--json",
                     str(path)]) == 0
    document = json.loads(path.read_text())
    assert document["partial"] and document["stop_reason"].startswith("naive-concat: out of memory: DefaultCPU")
    assert [(r["collator"], r["steps"], r["partial"]) for r in document["results"]] == [
        ("padded", 3, False), ("flatten", 3, False), ("naive-concat", 1, True)]
    assert document["comparison"]["flatten"]["max_abs_loss_diff_vs_padded"] < 1e-4
    assert document["contamination"] == [] and "ended before every collator" in document["contamination_not_checked"]
    assert "note: ended early: naive-concat: out of memory" in capsys.readouterr().out


def test_the_contamination_check_says_not_checked_and_why_when_only_one_example_fits():
    """tiny-gpt2 learns 2048 positions: two 1,500-token examples cannot be one naive-concat row, and one example alone
    has nothing to be contaminated by, so naive-concat must not read 0.0."""
    source = load_model_source("tiny-gpt2")
    examples = [[3 + i % 290 for i in range(1500)]] * 3
    rows, not_checked = contamination_check(source, "sdpa", examples, "cpu", seed=0)
    assert rows == []
    assert not_checked == ("only the first of 3 examples fits in the model's 2,048 positions as one row (1,500 + "
                           "1,500 tokens do not), and contamination needs two side by side")
    document = {"contamination": rows, "contamination_not_checked": not_checked, "partial": False,
                "results": [], "comparison": {}, "config": {}}
    assert report.contamination_title(document).startswith("Contamination check: not checked, only the first of 3")
    single = contamination_check(source, "sdpa", examples[:1], "cpu", seed=0)
    assert single[0] == [] and "single example" in single[1]
