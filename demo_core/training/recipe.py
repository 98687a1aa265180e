"""The run as a recipe: what a fine-tuner's own script needs to train exactly the steps one collator's burst trained,
read from the run's document (`recipe_of`), and the files that script reads offline (`write_assets`).

The recipe's values come from the functions the bursts themselves train with (`trainers.training_arguments`,
`trainers.sft_arguments`, `trainers.optimizer_class_and_kwargs`, `lora.lora_arguments`), applied to the run as it
was resolved, so a script cannot drift from its burst. presentation/recipe_script.py writes the script's text.

What the script loads, beside it in the folder `write_assets` fills:
- `model/`: a preset's random initial weights as every burst of the run starts from them (built from the run's
  seed, `save_pretrained`), with its tokenizer; a hub model or a local folder is loaded by its own name instead;
- `data/tokens.jsonl`: the examples as the run tokenized them, in its order, `labels` -100 where a token carries no
  loss (what the Trainer scripts train on);
- `data/records.jsonl`: the same examples as records in TRL's layout (what the SFTTrainer scripts tokenize, mask
  and pack themselves).

Attention: a script loads the model with the attention the run used when transformers has it built in. Our
`varlen` (attention/varlen.py) is registered by Packing Lab, which a fine-tuner's project does not have; the script
loads `sdpa` instead, which computes the same attention: for a packed row transformers builds the block-diagonal
causal mask from the restarting `position_ids`. Same math, other kernels: the losses agree to float rounding
(tests/test_takehome_scripts.py holds every collator to 1e-4).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from transformers import TrainingArguments
from transformers.loss.loss_utils import LOSS_MAPPING
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from trl import SFTConfig

from demo_core.attention.capability import model_class
from demo_core.batch_semantics import PER_DEVICE, as_per_device
from demo_core.collators import COLLATORS
from demo_core.config import RunConfig
from demo_core.data.schemas import CHAT_PROMPT_COMPLETION, CONVERSATION
from demo_core.models.sources import PRESETS
from demo_core.training.lora import lora_arguments
from demo_core.training.prepared import RESOLVED_IN_DOCUMENTS, Prepared
from demo_core.training.trainers import (
    CHECKPOINTING_ARGUMENT,
    optimizer_class_and_kwargs,
    sft_arguments,
    training_arguments,
)

MODEL_FOLDER = "model"
TOKENS_FILE = "data/tokens.jsonl"
RECORDS_FILE = "data/records.jsonl"
SCRIPT_NAME = "train_{}.py"
BUILT_IN_ATTENTION = ("sdpa", "eager", "flash_attention_2")
SCRIPT_ATTENTION_FOR_VARLEN = "sdpa"
# The TrainingArguments a script states: those that change what or how it trains. The rest of the bursts' (timing
# and process plumbing: logging off, DDP backends, dataloader workers) are Trainer's defaults or change nothing the
# losses show.
SCRIPT_ARGUMENTS = ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
                    "lr_scheduler_type", "weight_decay", "optim", "seed", "train_sampling_strategy", "bf16", "fp16",
                    "use_cpu", CHECKPOINTING_ARGUMENT, "fsdp", "fsdp_config")
# Stated only where they differ from the default of the script's config class (SFTConfig's differ from
# TrainingArguments': its bf16 is on), a default a fine-tuner would not write.
UNLESS_DEFAULT = ("weight_decay", "bf16", "fp16", "use_cpu", "fsdp", "fsdp_config")
# Columns of conversational layouts that the bursts keep as written (trainers._features), and the scripts too.
JSON_COLUMNS = {CONVERSATION: ("messages",), CHAT_PROMPT_COMPLETION: ("prompt", "completion")}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One collator's burst as a script trains it (presentation/recipe_script.py writes the text)."""

    collator: str
    trainer: str  # the registry's: "trainer" (transformers' Trainer on our tokens) or "sft" (TRL on the records)
    layout: str  # the registry's: padded, packed or naive
    packed_rows: bool  # Trainer packs the tokens into rows first (TRL's pack_dataset, best-fit-decreasing)
    model: str  # the run's model name: a preset, a hub id or a local folder
    preset: bool  # its initial weights lie beside the script, in MODEL_FOLDER
    attention: str  # the `attn_implementation` the script loads the model with
    run_attention: str  # the one the run used
    loss_type: str | None  # set on the model where transformers derives none from the class name (GPT-2)
    arguments: dict  # TrainingArguments (SFTConfig's inherited part)
    sft_arguments: dict  # SFTConfig's own
    lora: dict | None  # LoraConfig's arguments
    qlora: bool
    precision: str  # the run's: QLoRA's compute dtype follows it
    seed: int
    optimizer: tuple[str, dict] | None  # an optimizer class Trainer is handed (SGD), as torch.optim name and kwargs
    data_layout: str  # TRL's layout of the records
    json_columns: tuple[str, ...]  # record columns read as written (datasets' Json feature)
    truncate_to: int | None  # TRL's padding-free rows cut to this many tokens after preparation, as the burst cuts
    unlike_trl_defaults: tuple[str, ...]  # arguments at TrainingArguments' default where SFTConfig's differs (bf16)
    max_length: int
    device: str
    versions: dict  # the libraries the run trained with

    @property
    def script_name(self) -> str:
        return SCRIPT_NAME.format(self.collator)


def has_recipe(document: dict) -> bool:
    """Documents saved before recipes (and before Hugging Face's batch semantics) have none."""
    return document.get("config", {}).get("batch_semantics") == PER_DEVICE


def resolved_run(config: dict) -> RunConfig:
    """The run as its bursts trained it, from a document's `config`: the settings as asked, every "auto" replaced by
    what the engine resolved."""
    names = {field.name for field in dataclasses.fields(RunConfig)}
    settings = as_per_device(config)
    run = RunConfig(**{key: value for key, value in settings.items() if key in names})
    resolved = {name: config[f"resolved_{name}"] for name in RESOLVED_IN_DOCUMENTS if f"resolved_{name}" in config}
    return dataclasses.replace(run, collators=tuple(run.collators), lora_targets=tuple(run.lora_targets), **resolved)


def _loss_type(model_type: str | None) -> str | None:
    """transformers names a model's loss from its class name; a causal LM class it cannot place (GPT2LMHeadModel)
    gets the causal LM loss it computes, as ModelSource.build names it."""
    try:
        name = model_class(CONFIG_MAPPING[model_type]).__name__
    except KeyError:  # not a causal LM transformers knows: nothing to name
        return None
    return None if name in LOSS_MAPPING or "ForCausalLM" in name else "ForCausalLM"


def _script_arguments(run: RunConfig, sampler: str, config_class: type) -> dict:
    every = training_arguments(run, "unused", sampler)
    defaults = _defaults(config_class)
    return {name: every[name] for name in SCRIPT_ARGUMENTS
            if name in every and (name not in UNLESS_DEFAULT or every[name] != defaults.get(name))}


def _defaults(config_class: type) -> dict:
    return {field.name: field.default for field in dataclasses.fields(config_class)}


def recipe_of(document: dict, collator: str) -> Recipe:
    """The recipe of `collator`'s burst in a run document that has one (`has_recipe`)."""
    config, stats = document["config"], document["dataset_stats"]
    run, spec = resolved_run(config), COLLATORS[collator]
    optimizer = optimizer_class_and_kwargs(run)
    sft = sft_arguments(spec, run) if spec.trainer == "sft" else {}
    if sft and not sft["packing"]:
        sft = {**sft}
        sft.pop("packing_strategy")  # no packing: no strategy to state
    # TRL's padding-free without packing refuses a max length: examples the run truncated are cut after preparation
    truncate_to = run.max_length if spec.trainer == "sft" and not spec.packed_rows and stats.get("truncated") else None
    arguments = _script_arguments(run, spec.sampler, SFTConfig if spec.trainer == "sft" else TrainingArguments)
    trainer_defaults, trl_defaults = _defaults(TrainingArguments), _defaults(SFTConfig)
    unlike_trl = tuple(name for name, value in arguments.items() if spec.trainer == "sft"
                       and value == trainer_defaults.get(name) != trl_defaults.get(name))
    return Recipe(
        collator=collator, trainer=spec.trainer, layout=spec.layout, packed_rows=spec.packed_rows,
        model=run.model, preset=run.model in PRESETS,
        attention=run.attention if run.attention in BUILT_IN_ATTENTION else SCRIPT_ATTENTION_FOR_VARLEN,
        run_attention=run.attention, loss_type=_loss_type(config.get("model_type")),
        arguments=arguments, sft_arguments=sft,
        lora=lora_arguments(run.lora_rank, run.lora_targets) if run.lora_rank else None, qlora=run.qlora,
        precision=run.precision, seed=run.seed,
        optimizer=None if optimizer is None else (optimizer[0].__name__, optimizer[1]),
        data_layout=stats.get("layout", "text"), json_columns=JSON_COLUMNS.get(stats.get("layout"), ()),
        truncate_to=truncate_to, unlike_trl_defaults=unlike_trl, max_length=run.max_length, device=run.device,
        versions={name: value for name, value in document.get("environment", {}).items()
                  if name in ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "python")},
    )


def _write_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_assets(prepared: Prepared, directory: str | Path) -> list[Path]:
    """Writes what the run's scripts read offline into `directory`; returns the paths written."""
    directory = Path(directory)
    written = []
    if prepared.source.is_preset:
        folder = directory / MODEL_FOLDER
        # The weights every burst starts from (burst.py builds them the same way); the attention path draws no
        # weight, and eager needs no registration to load back.
        model = prepared.source.build("eager", torch.float32, seed=prepared.resolved.seed)
        model.save_pretrained(folder)
        prepared.source.tokenizer.save_pretrained(folder)
        written.append(folder)
    dataset = prepared.dataset
    _write_lines(directory / TOKENS_FILE, [{"input_ids": ids, "labels": labels}
                                           for ids, labels in zip(dataset.examples, dataset.labels)])
    _write_lines(directory / RECORDS_FILE, dataset.records)
    return written + [directory / TOKENS_FILE, directory / RECORDS_FILE]
