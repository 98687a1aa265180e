"""Collators: one small class per batching strategy, each built on a library collator, each reporting its batch.

Every collator returns the model's keys (documented per class) and records a `BatchStats` for each batch it
builds, so the burst can attribute real tokens and slots to the step that consumed them.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

import torch
from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening, PreTrainedTokenizerBase


@dataclasses.dataclass
class BatchStats:
    """What one batch costs: `padded_slots` token positions the model computes, `real_tokens` of them real data."""

    examples: int
    real_tokens: int
    padded_slots: int
    lengths: list[int]
    cu_seqlens: list[int]
    collate_s: float

    @property
    def pad_fraction(self) -> float:
        return 1.0 - self.real_tokens / self.padded_slots if self.padded_slots else 0.0

    @classmethod
    def of(cls, lengths: list[int], padded_slots: int, collate_s: float) -> "BatchStats":
        cu_seqlens = [0]
        for length in lengths:
            cu_seqlens.append(cu_seqlens[-1] + length)
        return cls(len(lengths), cu_seqlens[-1], padded_slots, list(lengths), cu_seqlens, collate_s)


class RecordingCollator:
    """Base: subclasses implement `collate`; calls are timed and their stats queued for the burst to read."""

    name = ""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.pending_stats: deque[BatchStats] = deque()

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        batch, lengths, padded_slots = self.collate(features)
        self.pending_stats.append(BatchStats.of(lengths, padded_slots, time.perf_counter() - started))
        return batch

    def collate(self, features: list[dict]) -> tuple[dict[str, torch.Tensor], list[int], int]:
        raise NotImplementedError


class PaddedCollator(RecordingCollator):
    """Pads to the longest example in the batch (transformers' `DataCollatorForSeq2Seq`).

    Returns `input_ids` and `attention_mask` (B, L_max) and `labels` (B, L_max) with -100 on padding.
    """

    name = "padded"

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        super().__init__(tokenizer)
        self._pad = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100, return_tensors="pt")

    def collate(self, features):
        lengths = [len(f["input_ids"]) for f in features]
        batch = self._pad([{"input_ids": f["input_ids"], "labels": f["input_ids"]} for f in features])
        return dict(batch), lengths, len(features) * max(lengths)


class FlattenCollator(RecordingCollator):
    """Padding-free: transformers' `DataCollatorWithFlattening` concatenates the batch into one row.

    Returns `input_ids`, `labels`, `position_ids` (1, Σ lengths) with positions restarting at 0 for each example and
    the first label of each example set to -100; `cu_seq_lens_q/k` (int32, B+1) and `max_length_q/k` (int) for
    varlen kernels; `seq_idx` (1, Σ lengths). No `attention_mask`: its absence is what turns packing on.
    """

    name = "flatten"

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        super().__init__(tokenizer)
        self._flatten = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)

    def collate(self, features):
        lengths = [len(f["input_ids"]) for f in features]
        batch = self._flatten([{"input_ids": f["input_ids"]} for f in features])
        return dict(batch), lengths, sum(lengths)


class NaiveConcatCollator(RecordingCollator):
    """The contaminated baseline: one row like `flatten` but without position restarts or segment boundaries.

    Returns `input_ids` and `labels` (1, Σ lengths) only, so attention runs causally over the whole row and every
    example sees the examples before it. Labels keep the -100 at boundaries so the loss counts the same tokens as
    `flatten`: the only difference left is the contamination.
    """

    name = "naive-concat"

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        super().__init__(tokenizer)
        self._flatten = DataCollatorWithFlattening(return_position_ids=False)

    def collate(self, features):
        lengths = [len(f["input_ids"]) for f in features]
        batch = self._flatten([{"input_ids": f["input_ids"]} for f in features])
        return dict(batch), lengths, sum(lengths)


class PackedRowsCollator(FlattenCollator):
    """For rows already packed by TRL's best-fit-decreasing `pack_dataset` (each row: `input_ids`, `seq_lengths`).

    Splits every row back into its examples and flattens them all (same keys as `flatten`), so a batch of B packed
    rows is one padding-free row of up to B x max_length tokens.
    """

    name = "bfd"

    def collate(self, features):
        examples = []
        for row in features:
            start = 0
            for length in row["seq_lengths"]:
                examples.append({"input_ids": row["input_ids"][start:start + length]})
                start += length
        return super().collate(examples)


COLLATOR_CLASSES = {
    "padded": PaddedCollator,
    "padded-grouped": PaddedCollator,  # same batches; the Trainer's group-by-length sampler changes the order
    "flatten": FlattenCollator,
    "naive-concat": NaiveConcatCollator,
    "bfd": PackedRowsCollator,
}


def make_collator(name: str, tokenizer: PreTrainedTokenizerBase) -> RecordingCollator:
    return COLLATOR_CLASSES[name](tokenizer)
