"""The two trainers a burst can run, built from one set of arguments: transformers' `Trainer` and TRL's `SFTTrainer`.

`build_trainer` reads the collator's registry entry (`CollatorSpec.trainer`) and returns the trainer plus the
recording collator it feeds, so the burst records every batch the same way whichever trainer runs:
- "trainer": `Trainer` with the spec's own collate class on the run's tokenized examples and their labels (-100 on
  the tokens that carry no loss, rendering.py); for `packed_rows` collators the data is first packed into rows of at
  most max_length by TRL's best-fit-decreasing `pack_dataset`.
- "sft": the blog's second recipe, `SFTTrainer` with `SFTConfig(padding_free=True)`, packing best-fit-decreasing
  itself when the spec says `packed_rows`. It gets the records in TRL's layout, not our tokens: TRL renders,
  tokenizes and masks them itself (`completion_only_loss` / `assistant_only_loss` from the run's `loss_on`), so
  its losses matching the Trainer's prove our masks are TRL's. SFTTrainer builds its own collator and refuses a
  custom one with padding-free, so its collator is wrapped after construction to record each batch; the keys stay
  TRL's.
Both count each optimizer step's micro-batches (gradient accumulation) so the burst records one step per step.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

import datasets
import torch
from transformers import PreTrainedTokenizerBase, Trainer, TrainingArguments
from trl import SFTConfig, SFTTrainer, pack_dataset

from demo_core.collators import CollatorSpec, RecordingCollator
from demo_core.config import RunConfig
from demo_core.data.schemas import CHAT_PROMPT_COMPLETION, CONVERSATION
from demo_core.precision import PRECISIONS
from demo_core.training.distributed import FSDPTrainerMixin, fsdp_training_arguments, world_size

if TYPE_CHECKING:
    from demo_core.data.loading import TokenizedDataset

datasets.disable_progress_bars()  # packing a few hundred rows should not draw progress bars in the CLI's output
# transformers 5.24 renamed TrainingArguments' `gradient_checkpointing` to `activation_checkpointing` (the old name
# warns); 5.17, which the GPU machine has, knows only the old one.
CHECKPOINTING_ARGUMENT = ("activation_checkpointing"
                          if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                          else "gradient_checkpointing")


class RecordingTrainer(FSDPTrainerMixin, Trainer):
    """Trainer that keeps each optimizer step's exact loss (the logged loss is rounded and averaged over logging
    steps), and tells its recording collator which micro-batches made each step.

    With gradient accumulation Trainer normalises every micro-batch's summed token loss by the trained tokens of the
    whole step (`num_items_in_batch`), so the step's loss is the sum of what its micro-batches return.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_losses: list[float] = []

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if batch_samples:
            self.data_collator.close_step(len(batch_samples))
            self.step_losses.append(0.0)
        return batch_samples, num_items_in_batch

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.step_losses[-1] += float(loss)
        return loss


class RecordingSFTTrainer(RecordingTrainer, SFTTrainer):
    """SFTTrainer keeping each step's exact loss (RecordingTrainer's `training_step` runs first in the MRO)."""


class TRLCollatorRecorder(RecordingCollator):
    """Wraps the collator SFTTrainer built and records each batch it returns; the keys are TRL's, unchanged.

    With padding-free, TRL's `DataCollatorForLanguageModeling` returns `input_ids`, `labels`, `position_ids` (1, T)
    with -100 at each example's first label, `cu_seq_lens_q/k`, `max_length_q/k` and `seq_idx`: the same keys and
    values as transformers' `DataCollatorWithFlattening` behind the `flatten` collator.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, inner):
        super().__init__(tokenizer)
        self.inner = inner

    def collate(self, features):
        # A packed row lists its examples in `seq_lengths`; an unpacked one is a single example.
        lengths = [length for row in features for length in row.get("seq_lengths", [len(row["input_ids"])])]
        batch = self.inner(features)
        return batch, lengths, batch["input_ids"].numel()


def _features(dataset: TokenizedDataset) -> datasets.Features | None:
    """Message lists stored as JSON (datasets' `Json`), so they reach the chat template as written: Arrow would give
    every message every key of every other (None where absent) and every tool-call argument object the same keys."""
    if dataset.layout not in (CONVERSATION, CHAT_PROMPT_COMPLETION):
        return None
    columns = ("messages",) if dataset.layout == CONVERSATION else ("prompt", "completion")
    return datasets.Features({**{column: datasets.List(datasets.Json()) for column in columns},
                              "tools": datasets.Value("string")})


class TrainingRows:
    """A run's examples as the trainers read them, each form built once per run (packing the whole data takes
    seconds for 20,000 examples, and the preview and the bursts all need it)."""

    def __init__(self, dataset: TokenizedDataset, max_length: int):
        self.dataset, self.max_length = dataset, max_length

    @functools.cached_property
    def one_per_row(self) -> datasets.Dataset:
        return datasets.Dataset.from_dict({"input_ids": self.dataset.examples, "labels": self.dataset.labels})

    @functools.cached_property
    def packed(self) -> datasets.Dataset:
        """Rows of at most max_length, filled by TRL's best-fit-decreasing, each with its `seq_lengths`."""
        return pack_dataset(self.one_per_row, seq_length=self.max_length, strategy="bfd")

    @functools.cached_property
    def records(self) -> datasets.Dataset:
        """The examples' records in TRL's layout (tools as JSON text, which SFTTrainer parses), for SFTTrainer."""
        features = _features(self.dataset)
        if features is None:
            return datasets.Dataset.from_list(self.dataset.records)
        rows = [{**record, "tools": json.dumps(record["tools"]) if "tools" in record else None}
                for record in self.dataset.records]
        return datasets.Dataset.from_list(rows, features=features)

    def for_trainer(self, spec: CollatorSpec) -> datasets.Dataset:
        """What the spec's trainer is handed: SFTTrainer tokenizes (and packs) the records by itself, Trainer reads
        our tokens, packed here for the packed-rows collators."""
        if spec.trainer == "sft":
            return self.records
        return self.packed if spec.packed_rows else self.one_per_row


def _truncated(dataset: datasets.Dataset, max_length: int) -> datasets.Dataset:
    """TRL's padding-free without packing enforces no max length and asks for truncated inputs: its prepared rows cut
    to max_length, keeping the start, as its own truncation (`truncation_mode="keep_start"`) and our data do."""
    return dataset.map(lambda row: {"input_ids": row["input_ids"][:max_length], "labels": row["labels"][:max_length]})


def optimizer_class_and_kwargs(run: RunConfig) -> tuple[type[torch.optim.Optimizer], dict] | None:
    """None lets Trainer build torch AdamW (`optim`); SGD with momentum 0.9 is named here (Trainer's "sgd" has none).
    Trainer builds both from the model it trains (under FSDP it refuses an optimizer built beforehand).

    Both fused: one kernel over all parameters instead of a Python loop of small ops per parameter, the same update.
    A step's fixed cost, which packing cannot shrink: small-llama SGD 13 -> 8 ms per step on one CPU thread. Under
    FSDP, SGD takes torch's loop: FSDP's sharded tensors (DTensor) have no rule for fused SGD in torch 2.13.
    """
    if run.optimizer == "sgd":
        return torch.optim.SGD, {"lr": run.learning_rate, "momentum": 0.9, "fused": not run.fsdp}
    return None


def training_arguments(run: RunConfig, output_dir: str, sampler: str = "sequential") -> dict:
    """The TrainingArguments every burst shares, Trainer's and TRL's SFTConfig alike (SFTConfig subclasses it)."""
    return dict(
        output_dir=output_dir,
        max_steps=run.steps,
        # Hugging Face's batch semantics (batch_semantics.py): the per-device micro-batch, examples (bfd: rows)
        per_device_train_batch_size=run.batch_size,
        gradient_accumulation_steps=run.grad_accum,
        learning_rate=run.learning_rate,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        # Fused AdamW (torch >= 2.4 on CPU too): small-llama 23 -> 7 ms, tiny-llama 4.2 -> 1.5 ms per step on one
        # CPU thread against torch's default per-parameter loop, which is what "adamw_torch" runs on a CPU.
        optim="adamw_torch_fused",
        seed=run.seed,
        # Pre-shuffled data read in order: every collator sees the same examples in the same order.
        train_sampling_strategy=sampler,
        **PRECISIONS[run.precision].trainer_flags(),
        use_cpu=run.device == "cpu",
        # Under torchrun / accelerate launch: DDP, gloo on CPU (NCCL needs GPUs), every parameter gets a gradient,
        # and the loss is normalised by the tokens of the whole global batch, so it equals one process's loss.
        # (a backend named in a single process would make accelerate look for a process group that is not there)
        ddp_backend="gloo" if run.device == "cpu" and world_size() > 1 else None,
        ddp_find_unused_parameters=False,
        average_tokens_across_devices=True,
        **fsdp_training_arguments(run.fsdp),
        # Trainer's and SFTConfig's defaults differ (SFTConfig turns it on): every burst follows the run's setting.
        **{CHECKPOINTING_ARGUMENT: run.gradient_checkpointing},
        dataloader_num_workers=0,
        dataloader_pin_memory=run.device == "cuda",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )


def sft_arguments(spec: CollatorSpec, run: RunConfig) -> dict:
    """SFTConfig's own arguments for a TRL burst (and its emitted script, recipe.py). TRL does not enforce
    `max_length` without packing, so it is None then (build_trainer truncates TRL's rows). Which tokens carry loss is
    TRL's own switch: `completion_only_loss` / `assistant_only_loss`."""
    return dict(
        padding_free=True,
        packing=spec.packed_rows,
        packing_strategy="bfd",
        max_length=run.max_length if spec.packed_rows else None,
        completion_only_loss=run.loss_on == "completion",
        assistant_only_loss=run.loss_on == "assistant",
    )


def sft_config(spec: CollatorSpec, output_dir: str, run: RunConfig) -> SFTConfig:
    return SFTConfig(**training_arguments(run, output_dir, spec.sampler), **sft_arguments(spec, run))


def build_trainer(spec: CollatorSpec, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                  rows: TrainingRows, run: RunConfig, output_dir: str
                  ) -> tuple[RecordingTrainer, RecordingCollator]:
    """(the trainer, the recording collator whose `pending_stats` it fills, one BatchStats per batch)."""
    if spec.trainer == "sft":
        trainer = RecordingSFTTrainer(
            model=model,
            args=sft_config(spec, output_dir, run),
            # Records in TRL's layout: SFTTrainer renders, tokenizes, masks and, with packing, packs them itself.
            train_dataset=rows.for_trainer(spec),
            processing_class=tokenizer,
            optimizer_cls_and_kwargs=optimizer_class_and_kwargs(run),
        )
        if not spec.packed_rows:
            trainer.train_dataset = _truncated(trainer.train_dataset, run.max_length)
        trainer.data_collator = collator = TRLCollatorRecorder(tokenizer, trainer.data_collator)
        return trainer, collator
    collator = spec.collate(tokenizer)
    trainer = RecordingTrainer(
        model=model,
        args=TrainingArguments(**training_arguments(run, output_dir, spec.sampler), remove_unused_columns=False),
        train_dataset=rows.for_trainer(spec),
        data_collator=collator,
        optimizer_cls_and_kwargs=optimizer_class_and_kwargs(run),
    )
    return trainer, collator
