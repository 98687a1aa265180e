"""Collators: one small class per batching strategy, each built on a library collator, each reporting its batch.

Every collator returns the model's keys (documented per class) and records a `BatchStats` for each batch it
builds, so the burst can attribute real tokens and slots to the step that consumed them. `COLLATORS`, at the end, is
the registry: one `CollatorSpec` per name the engine, the CLI and the page offer.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

import torch
from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening, PreTrainedTokenizerBase


@dataclasses.dataclass
class BatchStats:
    """What one batch costs: `padded_slots` token positions the model computes, `real_tokens` of them real data,
    `trained_tokens` of those the ones that carry loss (labels past each row's first that are not -100: what
    Trainer's `num_items_in_batch` counts). With gradient accumulation one optimizer step is several micro-batches:
    `merged` adds them up and keeps each one's example lengths in `micro_lengths`."""

    examples: int
    real_tokens: int
    padded_slots: int
    lengths: list[int]
    cu_seqlens: list[int]
    collate_s: float
    trained_tokens: int = 0
    micro_lengths: list[list[int]] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.micro_lengths = self.micro_lengths or [list(self.lengths)]

    @property
    def pad_fraction(self) -> float:
        return 1.0 - self.real_tokens / self.padded_slots if self.padded_slots else 0.0

    @classmethod
    def of(cls, lengths: list[int], padded_slots: int, collate_s: float, trained_tokens: int = 0) -> "BatchStats":
        cu_seqlens = [0]
        for length in lengths:
            cu_seqlens.append(cu_seqlens[-1] + length)
        return cls(len(lengths), cu_seqlens[-1], padded_slots, list(lengths), cu_seqlens, collate_s, trained_tokens)

    @classmethod
    def merged(cls, parts: list["BatchStats"]) -> "BatchStats":
        """One optimizer step of several micro-batches (gradient accumulation)."""
        if len(parts) == 1:
            return parts[0]
        merged = cls.of([length for part in parts for length in part.lengths],
                        sum(part.padded_slots for part in parts), sum(part.collate_s for part in parts),
                        sum(part.trained_tokens for part in parts))
        merged.micro_lengths = [list(part.lengths) for part in parts]
        return merged


def trained_tokens(labels: torch.Tensor) -> int:
    """Labels that carry loss in a batch the model shifts: each row's first label predicts nothing."""
    return int((labels[..., 1:] != -100).sum())


def _with_labels(feature: dict) -> dict:
    """An example's ids and labels (-100 where a token carries no loss; every token carries loss without them)."""
    return {"input_ids": feature["input_ids"], "labels": feature.get("labels", feature["input_ids"])}


class RecordingCollator:
    """Base: subclasses implement `collate`; calls are timed and their stats queued for the burst to read.

    `pending_stats` holds one BatchStats per call (micro-batch); the trainer groups those of each optimizer step
    with `close_step`, and the burst reads one entry of `step_stats` per step.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.pending_stats: deque[BatchStats] = deque()
        self.step_stats: deque[BatchStats] = deque()

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        batch, lengths, padded_slots = self.collate(features)
        collate_s = time.perf_counter() - started
        self.pending_stats.append(BatchStats.of(lengths, padded_slots, collate_s, trained_tokens(batch["labels"])))
        return batch

    def close_step(self, micro_batches: int) -> None:
        """The next `micro_batches` batches built (the trainer may have built one more ahead) are one step."""
        self.step_stats.append(BatchStats.merged([self.pending_stats.popleft() for _ in range(micro_batches)]))

    def collate(self, features: list[dict]) -> tuple[dict[str, torch.Tensor], list[int], int]:
        raise NotImplementedError


class PaddedCollator(RecordingCollator):
    """Pads to the longest example in the batch (transformers' `DataCollatorForSeq2Seq`).

    Returns `input_ids` and `attention_mask` (B, L_max) and `labels` (B, L_max) with -100 on padding and on the
    tokens that carry no loss.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        super().__init__(tokenizer)
        self._pad = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100, return_tensors="pt")

    def collate(self, features):
        lengths = [len(f["input_ids"]) for f in features]
        batch = self._pad([_with_labels(f) for f in features])
        return dict(batch), lengths, len(features) * max(lengths)


class FlattenCollator(RecordingCollator):
    """Padding-free: transformers' `DataCollatorWithFlattening` concatenates the batch into one row.

    Returns `input_ids`, `labels`, `position_ids` (1, Σ lengths) with positions restarting at 0 for each example and
    the first label of each example set to -100 (as every label that carries no loss); `cu_seq_lens_q/k` (int32,
    B+1) and `max_length_q/k` (int) for varlen kernels; `seq_idx` (1, Σ lengths). No `attention_mask`: its absence is
    what turns packing on.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        super().__init__(tokenizer)
        self._flatten = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)

    def collate(self, features):
        lengths = [len(f["input_ids"]) for f in features]
        batch = self._flatten([_with_labels(f) for f in features])
        return dict(batch), lengths, sum(lengths)


class NaiveConcatCollator(RecordingCollator):
    """The contaminated baseline: one row like `flatten` but without position restarts or segment boundaries.

    Returns `input_ids` and `labels` (1, Σ lengths) only, so attention runs causally over the whole row and every
    example sees the examples before it. Labels keep the -100 at boundaries so the loss counts the same tokens as
    `flatten`: the only difference left is the contamination.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        super().__init__(tokenizer)
        self._flatten = DataCollatorWithFlattening(return_position_ids=False)

    def collate(self, features):
        lengths = [len(f["input_ids"]) for f in features]
        batch = self._flatten([_with_labels(f) for f in features])
        return dict(batch), lengths, sum(lengths)


class PackedRowsCollator(FlattenCollator):
    """For rows already packed by TRL's best-fit-decreasing `pack_dataset` (each row: `input_ids`, `labels`,
    `seq_lengths`).

    Splits every row back into its examples and flattens them all (same keys as `flatten`), so a batch of B packed
    rows is one padding-free row of up to B x max_length tokens.
    """

    def collate(self, features):
        examples = []
        for row in features:
            start = 0
            for length in row["seq_lengths"]:
                examples.append({key: row[key][start:start + length] for key in ("input_ids", "labels") if key in row})
                start += length
        return super().collate(examples)


# ---- the registry: one entry per collator the engine, the CLI and the page offer ------------------------------

LAYOUTS = ("padded", "packed", "naive")


@dataclasses.dataclass(frozen=True)
class CollatorSpec:
    """Everything the engine, the CLI, the page and the plots know about one collator. No other module compares
    collator names: they read these fields. Adding a collator is one entry in `COLLATORS` plus its collate class.

    layout       what one step's batch looks like to the model:
                 "padded"  B rows padded to the longest, a 2-D attention mask
                 "packed"  one row, `position_ids` restart per example (needs a model that takes position_ids)
                 "naive"   one row, no restarts: attention runs across examples (the contaminated baseline)
    packed_rows  the data is first packed into rows of at most max_length by TRL's best-fit-decreasing, and the
                 batch size counts rows: other batches than padded's (so losses differ by design)
    sampler      the Trainer's `train_sampling_strategy` ("group_by_length" reorders: other batches too)
    trainer      "trainer": transformers' Trainer with `collate`; "sft": TRL's SFTTrainer with its own collator
                 (`collate` then only draws the batch TRL builds, for the page's picture)
    loss_parity  claims the same per-step losses as `padded` (same batches, exact packing): tests hold it to that
    """

    name: str
    label: str
    why: str
    layout: str
    collate: type[RecordingCollator]
    packed_rows: bool = False
    sampler: str = "sequential"
    trainer: str = "trainer"
    loss_parity: bool = False
    color: str = "#333333"
    linestyle: str | tuple = "-"

    def __post_init__(self):  # a registry entry, not user input: a wrong one is a programming error
        if self.layout not in LAYOUTS or self.trainer not in ("trainer", "sft"):
            raise ValueError(f"collator {self.name!r}: layout must be one of {LAYOUTS}, trainer 'trainer' or 'sft'")

    @property
    def needs_position_ids(self) -> bool:
        return self.layout == "packed"

    @property
    def same_batches_as_padded(self) -> bool:
        """Same examples in every step as `padded`: only then are speed and loss a like-for-like comparison."""
        return not self.packed_rows and self.sampler == "sequential"


# The collator every other one is compared against (speedup, loss difference, peak memory).
BASELINE = "padded"

COLLATORS: dict[str, CollatorSpec] = {spec.name: spec for spec in (
    CollatorSpec("padded", "padded: pad every example to the batch's longest",
                 "pads every example to the batch's longest: the baseline; its padding is computed and thrown away",
                 "padded", PaddedCollator, loss_parity=True, color="#8c8c8c", linestyle="-"),
    CollatorSpec("flatten", "flatten: padding-free, one row, positions restart (the blog's method)",
                 "the same examples in one row, positions restarting per example: no padding, identical loss",
                 "packed", FlattenCollator, loss_parity=True, color="#4e79a7", linestyle="--"),
    CollatorSpec("naive-concat", "naive-concat: one row, no restarts (contaminated baseline)",
                 "one row without restarts: every example attends to the ones before it, so its loss is wrong",
                 "naive", NaiveConcatCollator, color="#e15759", linestyle=":"),
    CollatorSpec("bfd", "bfd: TRL best-fit-decreasing packed rows, then flattened",
                 "packs the whole dataset into full rows of max length first, then flattens a batch of rows: other "
                 "batches than padded's (the loss differs by design) and more tokens per step",
                 "packed", PackedRowsCollator, packed_rows=True, color="#59a14f", linestyle="-."),
    CollatorSpec("padded-grouped", "padded-grouped: padded, batches grouped by length",
                 "padded, but batches of similar lengths: less padding, yet other batches (loss differs by design)",
                 "padded", PaddedCollator, sampler="group_by_length", color="#b07aa1", linestyle=(0, (6, 2))),
    CollatorSpec("trl-padding-free", "trl-padding-free: TRL SFTTrainer, padding_free=True (the blog's second recipe)",
                 "TRL's own trainer and collator, padding-free: the same batches and loss as flatten",
                 "packed", FlattenCollator, trainer="sft", loss_parity=True, color="#f28e2b",
                 linestyle=(0, (3, 1, 1, 1))),
    CollatorSpec("trl-bfd", "trl-bfd: TRL SFTTrainer, packing with best-fit-decreasing",
                 "TRL's trainer packing best-fit-decreasing: the same batches as bfd",
                 "packed", PackedRowsCollator, packed_rows=True, trainer="sft", color="#9c755f",
                 linestyle=(0, (1, 1))),
)}


def collator_names() -> tuple[str, ...]:
    return tuple(COLLATORS)


def collator_spec(name: str) -> CollatorSpec:
    return COLLATORS[name]


def make_collator(name: str, tokenizer: PreTrainedTokenizerBase) -> RecordingCollator:
    """The collate class that builds `name`'s batches (for the SFTTrainer ones: the batches TRL builds)."""
    return COLLATORS[name].collate(tokenizer)
