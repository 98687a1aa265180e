"""The engine end to end on tiny models: packing is exact, losses agree, naive concatenation is visibly wrong."""

import os
import threading

import pytest
import torch

from demo_core import DemoInputError, RunConfig, run_comparison
from demo_core.attention.contamination import contamination_check
from demo_core.data.loading import load
from demo_core.models.sources import PRESETS, load_model_source

TINY_PRESETS = [name for name in PRESETS if name.startswith("tiny-")]


@pytest.fixture(scope="module")
def examples():
    source = load_model_source("tiny-llama")
    return load("flan-like", source.tokenizer, 6, 1, 512).examples


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_flatten_matches_each_example_alone_and_naive_does_not(preset, examples):
    source = load_model_source(preset)
    rows, not_checked = contamination_check(source, "sdpa", examples, "cpu", seed=0)
    assert not_checked is None
    assert max(row["flatten_max_abs_logit_diff"] for row in rows) < 1e-4
    # Every example after the first sees its predecessors under naive concatenation.
    assert min(row["naive_concat_max_abs_logit_diff"] for row in rows[1:]) > 0.1


def test_presets_start_from_identical_weights():
    source = load_model_source("tiny-qwen2")
    first, second = source.build("sdpa", seed=3), source.build("sdpa", seed=3)
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b), name


@pytest.fixture(scope="module")
def padded_vs_flatten():
    config = RunConfig(model="tiny-llama", dataset="flan-like", samples=80, collators=("padded", "flatten"),
                       steps=10, batch_size=8, attention="sdpa")
    return run_comparison(config).to_dict()


def test_losses_padded_vs_flatten_agree_over_10_steps(padded_vs_flatten):
    padded, flatten = padded_vs_flatten["results"]
    assert len(padded["losses"]) == len(flatten["losses"]) == 10
    assert max(abs(a - b) for a, b in zip(padded["losses"], flatten["losses"])) < 1e-4
    assert padded_vs_flatten["comparison"]["flatten"]["max_abs_loss_diff_vs_padded"] < 1e-4


def test_same_examples_same_order(padded_vs_flatten):
    padded, flatten = padded_vs_flatten["results"]
    assert padded["step_real_tokens"] == flatten["step_real_tokens"]
    assert padded["step_examples"] == flatten["step_examples"] == [8] * 10
    assert flatten["pad_fraction"] == 0.0 and padded["pad_fraction"] > 0.3


def test_ideal_speedup_is_padded_slots_over_real_tokens(padded_vs_flatten):
    padded = padded_vs_flatten["results"][0]
    # The timed steps: not step 1 (warm-up), not the profiled ones (2, 6 and 10 of 10).
    assert padded["profiled_steps"] == [2, 6, 10]
    timed = [index for index in range(1, 10) if index + 1 not in (2, 6, 10)]
    timed_slots = sum(padded["step_padded_slots"][i] for i in timed)
    timed_real = sum(padded["step_real_tokens"][i] for i in timed)
    assert padded_vs_flatten["comparison"]["flatten"]["ideal_speedup"] == pytest.approx(timed_slots / timed_real)


def test_collators_take_turns_step_by_step_on_a_cpu():
    order = []
    config = RunConfig(model="tiny-llama", samples=16, collators=("padded", "flatten", "bfd"), steps=3, batch_size=4,
                       device="cpu")
    run_comparison(config, progress=lambda name, step, _total: order.append((name, step)))
    assert order == [(name, step) for step in (1, 2, 3) for name in ("padded", "flatten", "bfd")]


def test_training_runs_on_one_cpu_thread_unless_asked(padded_vs_flatten):
    before = torch.get_num_threads()
    assert padded_vs_flatten["environment"]["cpu_threads"] == padded_vs_flatten["config"]["resolved_threads"] == 1
    asked = min(2, os.cpu_count())
    run = run_comparison(RunConfig(model="tiny-llama", samples=8, collators=("flatten",), steps=1, batch_size=4,
                                   threads=asked)).to_dict()
    assert run["environment"]["cpu_threads"] == asked
    assert torch.get_num_threads() == before  # the process's setting is left as it was


def test_loss_falls_on_builtin_data():
    config = RunConfig(model="tiny-llama", dataset="flan-like", samples=400, collators=("flatten",), steps=50,
                       batch_size=8)
    losses = run_comparison(config).results[0].losses
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_local_model_folder_round_trip(tmp_path):
    source = load_model_source("tiny-llama")
    source.build("sdpa").save_pretrained(tmp_path)
    source.tokenizer.save_pretrained(tmp_path)
    config = RunConfig(model=str(tmp_path), samples=16, collators=("padded", "flatten"), steps=2, batch_size=4,
                       attention="sdpa")
    document = run_comparison(config).to_dict()
    assert document["comparison"]["flatten"]["max_abs_loss_diff_vs_padded"] < 1e-4


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(DemoInputError, match="not a model folder"):
        load_model_source(str(tmp_path))


def test_uncached_hub_id_offline_is_one_clear_error():
    # conftest.py runs the tests offline (HF_HUB_OFFLINE=1), as the app runs here
    with pytest.raises(DemoInputError, match="offline"):
        load_model_source("no-such-org/no-such-model-packing-lab")


@pytest.mark.parametrize("samples, batch_size", [(20, 8), (5, 64)])
def test_ideal_speedup_follows_the_trainers_batches_when_the_data_does_not_divide(samples, batch_size):
    """Epochs end with a short batch (20 = 8 + 8 + 4), and a batch larger than the data holds all of it."""
    config = RunConfig(samples=samples, collators=("padded",), steps=5, batch_size=batch_size, max_length=256)
    document = run_comparison(config).to_dict()
    padded = document["results"][0]
    assert padded["step_examples"] == ([8, 8, 4, 8, 8] if batch_size == 8 else [5] * 5)
    # The timed steps: not step 1 (warm-up), not step 2 (profiled).
    timed_slots, timed_real = sum(padded["step_padded_slots"][2:]), sum(padded["step_real_tokens"][2:])
    assert document["ideal_speedup"] == pytest.approx(timed_slots / timed_real)


def test_a_stop_that_comes_after_the_last_step_stops_nothing():
    # A time budget can run out between the last step and the end of the run: the run is complete all the same,
    # keeps its contamination check, and is not reported as cut short.
    stop = threading.Event()
    config = RunConfig(samples=16, steps=3, batch_size=4, collators=("padded", "flatten"))
    finished = run_comparison(config, stop_event=stop,
                              on_result=lambda result: stop.set() if result.collator == "flatten" else None)
    assert stop.is_set() and not finished.partial
    assert [result.steps for result in finished.results] == [3, 3] and finished.contamination


def test_a_run_packs_its_data_once_for_the_preview_and_every_burst(monkeypatch):
    # Best-fit-decreasing over the whole data takes seconds at the sample cap: bfd and trl-bfd's pictures and bfd's
    # burst read the same packed rows (trl-bfd's SFTTrainer packs inside TRL, as the blog's recipe does).
    from demo_core import preview
    from demo_core.training import engine, trainers

    packings = []
    real_pack = trainers.pack_dataset

    def counted_pack(*args, **kwargs):
        packings.append(1)
        return real_pack(*args, **kwargs)

    monkeypatch.setattr(trainers, "pack_dataset", counted_pack)
    prepared = engine.prepare(RunConfig(samples=16, steps=2, batch_size=4, collators=("padded", "bfd", "trl-bfd")))
    preview(prepared)
    run_comparison(prepared)
    assert len(packings) == 1
