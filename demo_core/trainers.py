"""The two trainers a burst can run, built from one set of arguments: transformers' `Trainer` and TRL's `SFTTrainer`.

`build_trainer` reads the collator's registry entry (`CollatorSpec.trainer`) and returns the trainer plus the
recording collator it feeds, so the burst records every batch the same way whichever trainer runs:
- "trainer": `Trainer` with the spec's own collate class; for `packed_rows` collators the data is first packed into
  rows of at most max_length by TRL's best-fit-decreasing `pack_dataset`.
- "sft": the blog's second recipe, `SFTTrainer` with `SFTConfig(padding_free=True)`, packing best-fit-decreasing
  itself when the spec says `packed_rows`. SFTTrainer builds its own collator and refuses a custom one with
  padding-free, so its collator is wrapped after construction to record each batch; the keys stay TRL's.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import datasets
import torch
from transformers import PreTrainedTokenizerBase, Trainer, TrainingArguments
from trl import SFTConfig, SFTTrainer, pack_dataset

from .collators import CollatorSpec, RecordingCollator
from .distributed import per_device_batch_size, world_size

if TYPE_CHECKING:
    from .burst import BurstSettings

datasets.disable_progress_bars()  # packing a few hundred rows should not draw progress bars in the CLI's output
# transformers 5.24 renamed TrainingArguments' `gradient_checkpointing` to `activation_checkpointing` (the old name
# warns); 5.17, which the GPU machine has, knows only the old one.
CHECKPOINTING_ARGUMENT = ("activation_checkpointing"
                          if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                          else "gradient_checkpointing")


class RecordingTrainer(Trainer):
    """Trainer that keeps each step's exact loss (the logged loss is rounded and averaged over logging steps)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_losses: list[float] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.step_losses.append(float(loss))
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


class TrainingRows:
    """A run's examples as the trainers read them, each form built once per run (packing the whole data takes
    seconds for 20,000 examples, and the preview and the bursts all need it)."""

    def __init__(self, examples: list[list[int]], max_length: int):
        self.examples, self.max_length = examples, max_length

    @functools.cached_property
    def one_per_row(self) -> datasets.Dataset:
        return datasets.Dataset.from_dict({"input_ids": self.examples})

    @functools.cached_property
    def packed(self) -> datasets.Dataset:
        """Rows of at most max_length, filled by TRL's best-fit-decreasing, each with its `seq_lengths`."""
        return pack_dataset(self.one_per_row, seq_length=self.max_length, strategy="bfd")

    def for_trainer(self, spec: CollatorSpec) -> datasets.Dataset:
        """What the spec's trainer is handed: SFTTrainer packs by itself, Trainer reads rows packed here."""
        return self.packed if spec.packed_rows and spec.trainer == "trainer" else self.one_per_row


def make_optimizer(model: torch.nn.Module, settings: BurstSettings):
    """None lets Trainer build torch AdamW; SGD with momentum 0.9 is built here (Trainer's "sgd" has none).

    Both fused: one kernel over all parameters instead of a Python loop of small ops per parameter, the same update.
    A step's fixed cost, which packing cannot shrink: small-llama SGD 13 -> 8 ms per step on one CPU thread.
    """
    if settings.optimizer == "sgd":  # the trainable parameters only, as Trainer's own optimizers (LoRA: the adapters)
        trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
        return torch.optim.SGD(trainable, lr=settings.learning_rate, momentum=0.9, fused=True)
    return None


def training_arguments(settings: BurstSettings, output_dir: str, sampler: str = "sequential") -> dict:
    """The TrainingArguments every burst shares, Trainer's and TRL's SFTConfig alike (SFTConfig subclasses it)."""
    return dict(
        output_dir=output_dir,
        max_steps=settings.steps,
        per_device_train_batch_size=per_device_batch_size(settings.batch_size),
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        # Fused AdamW (torch >= 2.4 on CPU too): small-llama 23 -> 7 ms, tiny-llama 4.2 -> 1.5 ms per step on one
        # CPU thread against torch's default per-parameter loop, which is what "adamw_torch" runs on a CPU.
        optim="adamw_torch_fused",
        seed=settings.seed,
        # Pre-shuffled data read in order: every collator sees the same examples in the same order.
        train_sampling_strategy=sampler,
        bf16=settings.precision == "bf16",
        fp16=settings.precision == "fp16",
        use_cpu=settings.device == "cpu",
        # Under torchrun / accelerate launch: DDP, gloo on CPU (NCCL needs GPUs), every parameter gets a gradient,
        # and the loss is normalised by the tokens of the whole global batch, so it equals one process's loss.
        # (a backend named in a single process would make accelerate look for a process group that is not there)
        ddp_backend="gloo" if settings.device == "cpu" and world_size() > 1 else None,
        ddp_find_unused_parameters=False,
        average_tokens_across_devices=True,
        # Trainer's and SFTConfig's defaults differ (SFTConfig turns it on): every burst follows the run's setting.
        **{CHECKPOINTING_ARGUMENT: settings.gradient_checkpointing},
        dataloader_num_workers=0,
        dataloader_pin_memory=settings.device == "cuda",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )


def sft_config(spec: CollatorSpec, output_dir: str, settings: BurstSettings) -> SFTConfig:
    """TRL does not enforce `max_length` without packing, so it is None then (the examples are already truncated)."""
    return SFTConfig(
        **training_arguments(settings, output_dir, spec.sampler),
        padding_free=True,
        packing=spec.packed_rows,
        packing_strategy="bfd",
        max_length=settings.max_length if spec.packed_rows else None,
    )


def build_trainer(spec: CollatorSpec, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                  rows: TrainingRows, settings: BurstSettings, output_dir: str,
                  optimizer) -> tuple[RecordingTrainer, RecordingCollator]:
    """(the trainer, the recording collator whose `pending_stats` it fills, one BatchStats per batch)."""
    if spec.trainer == "sft":
        trainer = RecordingSFTTrainer(
            model=model,
            args=sft_config(spec, output_dir, settings),
            # Tokenized rows (`input_ids`): SFTTrainer skips tokenizing and, with packing, packs them itself.
            train_dataset=rows.for_trainer(spec),
            processing_class=tokenizer,
            optimizers=(optimizer, None),
        )
        trainer.data_collator = collator = TRLCollatorRecorder(tokenizer, trainer.data_collator)
        return trainer, collator
    collator = spec.collate(tokenizer)
    trainer = RecordingTrainer(
        model=model,
        args=TrainingArguments(**training_arguments(settings, output_dir, spec.sampler), remove_unused_columns=False),
        train_dataset=rows.for_trainer(spec),
        data_collator=collator,
        optimizers=(optimizer, None),
    )
    return trainer, collator
