"""The TRL SFTTrainer path: same examples, same order, same initial weights -> the same losses as the engine's own.

`trl-padding-free` must track `flatten` and `trl-bfd` must track `bfd` step by step: both pairs build identical
batches through different code (TRL's collator and trainer vs transformers' collator and Trainer).
"""

import pytest

from demo_core import RunConfig, preview, run_comparison
from demo_core.collators import COLLATORS
from demo_core.training.trainers import sft_config

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def document():
    config = RunConfig(model="tiny-llama", dataset="flan-like", samples=32, steps=5, batch_size=4, max_length=256,
                       collators=("flatten", "trl-padding-free", "bfd", "trl-bfd"), attention="varlen")
    return run_comparison(config).to_dict()


def _result(document, collator):
    return next(r for r in document["results"] if r["collator"] == collator)


@pytest.mark.parametrize("engine,trl", [("flatten", "trl-padding-free"), ("bfd", "trl-bfd")])
def test_trl_losses_match_the_engine_path_step_by_step(document, engine, trl):
    ours, theirs = _result(document, engine), _result(document, trl)
    assert theirs["steps"] == ours["steps"] == 5
    # Same batches: the same real tokens per step, and padding-free means no slot is padding.
    assert theirs["step_real_tokens"] == ours["step_real_tokens"]
    assert theirs["step_padded_slots"] == theirs["step_real_tokens"]
    diffs = [abs(a - b) for a, b in zip(ours["losses"], theirs["losses"])]
    assert max(diffs) < TOLERANCE, diffs
    assert ours["losses"][-1] < ours["losses"][0]  # it trained: equal losses are not two frozen models


def test_trl_results_report_every_metric_a_burst_does(document):
    ours, theirs = _result(document, "flatten"), _result(document, "trl-padding-free")
    assert theirs.keys() == ours.keys()
    assert theirs["attention"] == "varlen" and theirs["memory"] and theirs["peak_memory_bytes"]
    assert all(t > 0 for t in theirs["step_times_s"]) and all(c > 0 for c in theirs["step_collate_s"])
    assert document["comparison"]["trl-padding-free"]["ideal_speedup"] == document["ideal_speedup"]
    # TRL computes the loss outside the model (fused LM head): the anatomy still finds every phase.
    phases = theirs["time_anatomy"]["phases"]
    assert min(phases["forward"], phases["backward"], phases["optimizer"]) > 0


@pytest.mark.parametrize("checkpointing, loss_on", [(False, "completion"), (True, "assistant")])
def test_sft_config_follows_the_run_not_trl_defaults(tmp_path, checkpointing, loss_on):
    settings = RunConfig(steps=1, batch_size=4, max_length=128, learning_rate=1e-3, optimizer="adamw",
                             precision="fp32", device="cpu", seed=0, gradient_checkpointing=checkpointing,
                             grad_accum=2, loss_on=loss_on)
    padding_free = sft_config(COLLATORS["trl-padding-free"], str(tmp_path), settings)
    bfd = sft_config(COLLATORS["trl-bfd"], str(tmp_path), settings)
    # SFTConfig defaults to checkpointing on; padding-free without packing refuses a max_length.
    assert padding_free.activation_checkpointing is bfd.activation_checkpointing is checkpointing
    assert (padding_free.padding_free, padding_free.packing, padding_free.max_length) == (True, False, None)
    assert (bfd.packing, bfd.packing_strategy, bfd.max_length) == (True, "bfd", 128)
    # Which tokens carry loss is TRL's own switch; the batch is 2 micro-batches of 4 (accumulation multiplies).
    assert (bfd.completion_only_loss, bfd.assistant_only_loss) == (loss_on == "completion", loss_on == "assistant")
    assert (bfd.per_device_train_batch_size, bfd.gradient_accumulation_steps) == (4, 2)


def test_preview_shows_trl_batches_like_their_engine_twins():
    shown = preview(RunConfig(samples=16, batch_size=4, max_length=256,
                              collators=("flatten", "trl-padding-free", "bfd", "trl-bfd")))["batches"]
    assert shown["trl-padding-free"]["cu_seqlens"] == shown["flatten"]["cu_seqlens"]
    assert shown["trl-bfd"]["row_lengths"] == shown["bfd"]["row_lengths"]
