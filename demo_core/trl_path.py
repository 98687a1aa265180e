"""The blog's second recipe: TRL's `SFTTrainer` with `SFTConfig(padding_free=True)`, with or without BFD packing.

Two engine collator names run through here instead of `burst.run_burst`:
- `trl-padding-free`: `padding_free=True`, no packing. Each batch of B examples becomes one row, like `flatten`.
  TRL does not enforce `max_length` without packing, so it is None here (the examples are already truncated).
- `trl-bfd`: `packing=True, packing_strategy="bfd"` (padding-free is implied): rows of at most `max_length` tokens
  packed best-fit-decreasing; the batch size counts packed rows, as with the engine's `bfd` collator.
SFTTrainer builds its own collator and refuses a custom one with padding-free, so the burst wraps TRL's collator
after construction to record each batch, and reuses burst.py's step recorder, memory recorder and loss-keeping
trainer, so the `Result` means exactly what a Trainer burst's does.
"""

from __future__ import annotations

import tempfile
import threading

import datasets
import torch
from trl import SFTConfig, SFTTrainer

from .burst import (BurstSettings, MemoryRecorder, ProgressFn, RecordingTrainer, StepRecorder, _make_optimizer,
                    release_memory, train_and_record, training_arguments)
from .collators import RecordingCollator
from .distributed import merge_ranks
from .models import ModelSource
from .results import Result

TRL_COLLATORS = ("trl-padding-free", "trl-bfd")
# The engine collator that builds the same batches, for views that show a batch without training.
SAME_BATCHES_AS = {"trl-padding-free": "flatten", "trl-bfd": "bfd"}


class RecordingSFTTrainer(RecordingTrainer, SFTTrainer):
    """SFTTrainer keeping each step's exact loss (RecordingTrainer's `training_step` runs first in the MRO)."""


class TRLCollatorRecorder(RecordingCollator):
    """Wraps the collator SFTTrainer built and records each batch it returns; the keys are TRL's, unchanged.

    With padding-free, TRL's `DataCollatorForLanguageModeling` returns `input_ids`, `labels`, `position_ids` (1, T)
    with -100 at each example's first label, `cu_seq_lens_q/k`, `max_length_q/k` and `seq_idx`: the same keys and
    values as transformers' `DataCollatorWithFlattening` behind the `flatten` collator.
    """

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.inner = None  # set once SFTTrainer has built its collator

    def collate(self, features):
        # A packed row lists its examples in `seq_lengths`; an unpacked one is a single example.
        lengths = [length for row in features for length in row.get("seq_lengths", [len(row["input_ids"])])]
        batch = self.inner(features)
        return batch, lengths, batch["input_ids"].numel()


def _sft_config(collator_name: str, output_dir: str, settings: BurstSettings) -> SFTConfig:
    packing = collator_name == "trl-bfd"
    return SFTConfig(
        **training_arguments(settings, output_dir),
        padding_free=True,
        packing=packing,
        packing_strategy="bfd",
        max_length=settings.max_length if packing else None,
    )


def run_trl_burst(source: ModelSource, examples: list[list[int]], collator_name: str, attention: str,
                  settings: BurstSettings, progress: ProgressFn | None = None,
                  stop_event: threading.Event | None = None) -> Result:
    """One burst through SFTTrainer; the same `Result` fields as `burst.run_burst`."""
    model = source.build(attention, torch.float32, seed=settings.seed)
    model.config.use_cache = False  # a cache turns packing detection off (FIELD_NOTES)
    collator = TRLCollatorRecorder(source.tokenizer)
    recorder = StepRecorder(collator, settings.device, settings.steps, collator_name, progress, stop_event)
    memory_recorder = MemoryRecorder(model, settings.device)
    optimizer = _make_optimizer(model, settings)
    with tempfile.TemporaryDirectory(prefix="packing-lab-trl-") as output_dir:
        args = _sft_config(collator_name, output_dir, settings)
        trainer = RecordingSFTTrainer(
            model=model,
            args=args,
            # Tokenized rows (`input_ids`): SFTTrainer skips tokenizing and, for trl-bfd, packs them itself.
            train_dataset=datasets.Dataset.from_dict({"input_ids": examples}),
            processing_class=source.tokenizer,
            callbacks=[recorder, memory_recorder],
            optimizers=(optimizer, None),
        )
        collator.inner = trainer.data_collator
        trainer.data_collator = collator
        result = train_and_record(trainer, source, recorder, memory_recorder, collator_name, attention, settings)
    del trainer, model, optimizer, memory_recorder
    release_memory()
    return merge_ranks(result)
