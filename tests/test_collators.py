"""Batch statistics and keys of every collator, on the hand-made batch of lengths [4, 16, 31, 14]."""

import pytest
import torch

from demo_core.collators import make_collator
from demo_core.models.sources import byte_tokenizer

LENGTHS = [4, 16, 31, 14]


@pytest.fixture
def features():
    start = 3  # ids 0-2 are ByT5's specials; keep real ids above them so padding is recognisable
    return [{"input_ids": list(range(start, start + n))} for n in LENGTHS]


def collate(name, features):
    collator = make_collator(name, byte_tokenizer())
    batch = collator(features)
    (stats,) = collator.pending_stats
    return batch, stats


def test_padded_stats_exact(features):
    batch, stats = collate("padded", features)
    assert stats.real_tokens == 65
    assert stats.padded_slots == 124
    assert stats.cu_seqlens == [0, 4, 20, 51, 65]
    assert stats.pad_fraction == pytest.approx(1 - 65 / 124)
    assert batch["input_ids"].shape == (4, 31)
    assert batch["attention_mask"].sum().item() == 65
    assert (batch["labels"] == -100).sum().item() == 124 - 65


def test_flatten_keys_and_boundaries(features):
    batch, stats = collate("flatten", features)
    assert (stats.real_tokens, stats.padded_slots, stats.pad_fraction) == (65, 65, 0.0)
    assert "attention_mask" not in batch  # a mask would silently turn packing off
    assert batch["cu_seq_lens_q"].tolist() == [0, 4, 20, 51, 65]
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["max_length_q"] == 31
    positions = batch["position_ids"][0]
    assert torch.nonzero(positions == 0).flatten().tolist() == [0, 4, 20, 51]
    assert (batch["labels"][0, [0, 4, 20, 51]] == -100).all()
    assert (batch["labels"] != -100).sum().item() == 65 - 4


def test_naive_concat_has_no_restarts(features):
    batch, stats = collate("naive-concat", features)
    assert stats.cu_seqlens == [0, 4, 20, 51, 65]
    assert set(batch) == {"input_ids", "labels"}  # no positions: the model counts 0..64 across examples


def test_bfd_rows_split_back_into_examples(features):
    row = {"input_ids": sum((f["input_ids"] for f in features), []), "seq_lengths": LENGTHS}
    batch, stats = collate("bfd", [row])
    assert stats.cu_seqlens == [0, 4, 20, 51, 65]
    assert batch["cu_seq_lens_q"].tolist() == [0, 4, 20, 51, 65]


def test_tokens_that_carry_no_loss_stay_minus_100_in_every_collator(features):
    # The first half of each example is its prompt (-100), the second half its answer.
    masked = [{**f, "labels": [-100] * (len(f["input_ids"]) // 2) + f["input_ids"][len(f["input_ids"]) // 2:]}
              for f in features]
    answers = sum(n - n // 2 for n in LENGTHS)
    for name in ("padded", "flatten", "naive-concat"):
        batch, stats = collate(name, masked)
        assert stats.trained_tokens == (batch["labels"] != -100).sum().item() == answers, name
    row = {key: sum((f[key] for f in masked), []) for key in ("input_ids", "labels")}
    batch, stats = collate("bfd", [{**row, "seq_lengths": LENGTHS}])
    assert batch["labels"].tolist() == collate("flatten", masked)[0]["labels"].tolist()
    assert stats.trained_tokens == answers


def test_a_step_of_micro_batches_adds_them_up_and_keeps_each_ones_lengths(features):
    collator = make_collator("padded", byte_tokenizer())
    for batch in (features[:2], features[2:], features[:1]):  # the trainer builds one batch ahead
        collator(batch)
    collator.close_step(2)
    (step,) = collator.step_stats
    assert step.micro_lengths == [[4, 16], [31, 14]] and step.lengths == LENGTHS
    assert (step.real_tokens, step.padded_slots, step.examples) == (65, 2 * 16 + 2 * 31, 4)
    assert step.trained_tokens == 65 - 4 and len(collator.pending_stats) == 1
