"""A collator's burst as the short Python script a fine-tuner would write (`script`), from its recipe
(demo_core/training/recipe.py): transformers' `Trainer` for the Trainer collators (our tokens; the collator is the
one line that changes from padded), TRL's `SFTTrainer` / `SFTConfig` for the TRL ones (the records; TRL renders,
masks and packs them), peft's `LoraConfig` for LoRA and QLoRA.

`python train_<collator>.py` in a folder `compare --emit-code` filled trains the burst's steps and prints, as its
last line of standard output, the Trainer's logged loss of every step (`logging_steps=1`) as a JSON list. `with_code`
adds each result's script to a run document (`code`), which the CLI's JSON, the page and the API carry.
"""

from __future__ import annotations

import json
import textwrap

from demo_core.collators import COLLATORS
from demo_core.config import RunConfig
from demo_core.settings import declared, flag
from demo_core.training.recipe import (
    MODEL_FOLDER,
    RECORDS_FILE,
    TOKENS_FILE,
    Recipe,
    has_recipe,
    recipe_of,
)

# Why an argument has the value it has, where a reader would ask (the rest are plain settings); a switch's note is
# said only where it is on (loss masks) or where it says why it is off.
ARGUMENT_NOTES = {
    "per_device_train_batch_size": "examples per device and forward pass",
    "gradient_accumulation_steps": "micro-batches per optimizer step",
    "train_sampling_strategy": "the examples in the run's order",
    "use_cpu": "the run trained on a CPU",
    "completion_only_loss": "loss on the completion only",
    "assistant_only_loss": "loss on the assistant turns only",
    "logging_steps": "the loss of every step",
    "remove_unused_columns": "seq_lengths reaches the collator",
}
SAMPLER_NOTES = {"group_by_length": "batches of similar lengths (other batches than padded's)"}
PACKED_ROWS_NOTE = "rows of up to max length, best-fit-decreasing"
# The Trainer scripts' collator by the registry's layout, and what it does.
COLLATOR_LINES = {
    "padded": ('DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)',
               "pads to the batch's longest"),
    "packed": ("DataCollatorWithFlattening()", "padding-free: one row, positions restart per example"),
    "naive": ("DataCollatorWithFlattening(return_position_ids=False)",
              "one row, no restarts: each example sees the ones before it"),
}


def literal(value) -> str:
    """A value as Python source, strings in double quotes as the rest of the script writes them."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(key)}: {literal(item)}" for key, item in value.items()) + "}"
    return repr(value)


def command_line(config: dict, directory: str = "DIR") -> str:
    """The CLI line that runs the same comparison and writes the scripts with what they read into `directory`."""
    settings = {item.name: item for item in declared(RunConfig) if item.cli}
    parts = ["python -m demo_core compare"]
    for name, item in settings.items():
        value = config.get(name, item.default)
        if isinstance(value, list):
            value = tuple(value)
        if value == item.default or value is None:
            continue
        if item.base is bool:
            parts.append(flag(item) if value else f"--no-{flag(item)[2:]}")
        else:
            parts.append(f"{flag(item)} {','.join(value) if isinstance(value, tuple) else value}")
    return " ".join(parts + [f"--emit-code {directory}"])


def _arguments(recipe: Recipe) -> list[str]:
    """The keyword lines of TrainingArguments / SFTConfig, each with its note."""
    values = {"output_dir": 'str(HERE / "out")', **{name: literal(value) for name, value in recipe.arguments.items()}}
    values.update({name: literal(value) for name, value in recipe.sft_arguments.items()})
    values.update(logging_steps="1", save_strategy='"no"', report_to='"none"')
    if recipe.trainer == "trainer" and recipe.packed_rows:
        values["remove_unused_columns"] = "False"
    notes = {**ARGUMENT_NOTES, "train_sampling_strategy": SAMPLER_NOTES.get(
        recipe.arguments.get("train_sampling_strategy"), ARGUMENT_NOTES["train_sampling_strategy"])}
    if recipe.packed_rows:
        notes.update(per_device_train_batch_size="packed rows per device and forward pass", max_length=PACKED_ROWS_NOTE)
    elif recipe.trainer == "sft":
        notes.update(padding_free="the change from padded (False): each batch in one row, no padding",
                     max_length="TRL's padding-free without packing takes no max length")
    lines = []
    for name, value in values.items():
        note = None if value == "False" and name in ("completion_only_loss", "assistant_only_loss") else \
            notes.get(name)
        if name in recipe.unlike_trl_defaults:
            note = "the run's; SFTConfig's default differs"
        lines.append(f"    {name}={value},{f'  # {note}' if note else ''}")
    return lines


def wrapped(text: str, width: int = 100, indent: str = "", joiner: str = "") -> list[str]:
    """`text` in lines of at most about `width` characters, broken at spaces, each but the last ending in
    `joiner` (a shell's line continuation)."""
    lines = textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + " " * 4 * bool(joiner),
                          break_long_words=False, break_on_hyphens=False)
    return [line + joiner for line in lines[:-1]] + lines[-1:]


def _header(recipe: Recipe, steps: int, command: str) -> list[str]:
    spec = COLLATORS[recipe.collator]
    trainer = "TRL's SFTTrainer" if recipe.trainer == "sft" else "transformers' Trainer"
    versions = ", ".join(f"{name} {version}" for name, version in recipe.versions.items() if name != "python")
    about = (f"Packing Lab's {recipe.collator} burst as a script, with {trainer}: the same initial weights, examples, "
             f"order and settings. `python {recipe.script_name}` trains its {steps} steps and prints the loss of "
             f"every step as a JSON list on its last line. Written for {versions or 'the run’s libraries'}. The "
             f"files it reads (the model, the data) are written beside it by:")
    title = wrapped(f"{recipe.collator}: {spec.why}.")
    return ['"""' + title[0], *title[1:], "", *wrapped(about),
            *wrapped(command, indent="    ", joiner=" \\"), '"""']


def _imports(recipe: Recipe) -> list[str]:
    transformers = {"AutoModelForCausalLM", "AutoTokenizer"}
    extra: list[str] = []
    if recipe.trainer == "sft":
        extra.append("from trl import SFTConfig, SFTTrainer")
    else:
        transformers |= {"Trainer", "TrainingArguments"}
        transformers.add("DataCollatorForSeq2Seq" if recipe.layout == "padded" else "DataCollatorWithFlattening")
        if recipe.packed_rows:
            extra.append("from trl import pack_dataset")
    if recipe.qlora:
        transformers.add("BitsAndBytesConfig")
    datasets = ["Dataset"] + (["Features", "Json", "List", "Value"] if recipe.trainer == "sft" and
                              recipe.json_columns else [])
    lines = ["import json", "from pathlib import Path", "", "import torch",
             f"from datasets import {', '.join(datasets)}"]
    if recipe.lora:
        lines.append("from peft import LoraConfig, get_peft_model")
    lines.append(f"from transformers import {', '.join(sorted(transformers))}")
    return lines + extra


def _model(recipe: Recipe) -> list[str]:
    if recipe.preset:
        lines = [f"MODEL = HERE / {literal(MODEL_FOLDER)}  # {recipe.model}'s random initial weights, as every burst "
                 f"of the run starts (seed {recipe.seed})",
                 "tokenizer = AutoTokenizer.from_pretrained(MODEL)"]
    else:
        lines = [f"MODEL = {literal(recipe.model)}",
                 "tokenizer = AutoTokenizer.from_pretrained(MODEL)",
                 "tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token  # as the run pads without one",
                 'tokenizer.padding_side = "right"']
    if recipe.attention != recipe.run_attention:
        lines += [f"# The run used Packing Lab's {literal(recipe.run_attention)} attention (per example, registered "
                  "with transformers' AttentionInterface).",
                  f"# {literal(recipe.attention)} computes the same: for a packed row transformers builds the "
                  "block-diagonal causal mask from",
                  "# the restarting position_ids. On a GPU with flash-attn, \"flash_attention_2\" is the per-example "
                  "kernel."]
    if recipe.qlora:
        dtype = "torch.float32" if recipe.precision == "fp32" else "torch.bfloat16"
        lines += ["model = AutoModelForCausalLM.from_pretrained(",
                  f"    MODEL, attn_implementation={literal(recipe.attention)}, dtype={dtype}, device_map={{\"\": 0}},",
                  "    quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", "
                  "bnb_4bit_use_double_quant=True,",
                  f"                                           bnb_4bit_compute_dtype={dtype}))"]
    else:
        lines.append(f"model = AutoModelForCausalLM.from_pretrained(MODEL, attn_implementation="
                     f"{literal(recipe.attention)}, dtype=torch.float32)")
    lines.append("model.config.use_cache = False  # with a cache, transformers would not see where packed examples "
                 "start")
    if recipe.loss_type:
        lines.append(f"model.loss_type = {literal(recipe.loss_type)}  # transformers names no loss for this class; "
                     "its loss is the causal LM's")
    if recipe.lora:
        arguments = ", ".join(f"{name}={literal(value)}" for name, value in recipe.lora.items())
        lines += [f"torch.manual_seed({recipe.seed})  # LoRA's A matrices drawn as the run drew them (B starts at 0)",
                  f"model = get_peft_model(model, LoraConfig({arguments}))"]
    return lines


def _data(recipe: Recipe) -> list[str]:
    if recipe.trainer == "sft":
        lines = ["# The examples in the run's order, in TRL's layout: SFTTrainer renders, tokenizes, masks"
                 + (" and packs" if recipe.sft_arguments.get("packing") else "") + " them",
                 f"rows = [json.loads(line) for line in open(HERE / {literal(RECORDS_FILE)})]"]
        if not recipe.json_columns:
            return lines + ["train_dataset = Dataset.from_list(rows)"]
        columns = ", ".join(f"{literal(column)}: List(Json())" for column in recipe.json_columns)
        return lines + [
            "# Messages as written (datasets' Json feature; Arrow would give each the keys of every other), "
            "tools as JSON text",
            f"features = Features({{{columns}, \"tools\": Value(\"string\")}})",
            'rows = [{**row, "tools": json.dumps(row["tools"]) if "tools" in row else None} for row in rows]',
            "train_dataset = Dataset.from_list(rows, features=features)"]
    lines = ["# The examples as the run tokenized them, in its order; labels are -100 where a token carries no loss",
             f"rows = [json.loads(line) for line in open(HERE / {literal(TOKENS_FILE)})]",
             "train_dataset = Dataset.from_list(rows)"]
    if recipe.packed_rows:
        lines += ["# The examples packed into rows of up to max length, best-fit-decreasing, each row with its "
                  "seq_lengths",
                  f"train_dataset = pack_dataset(train_dataset, seq_length={recipe.max_length}, strategy=\"bfd\")",
                  "flatten = DataCollatorWithFlattening()",
                  "",
                  "",
                  "def data_collator(rows):",
                  '    """Each packed row split back into its examples, then one padding-free row (positions restart '
                  'per example)."""',
                  "    examples = []",
                  "    for row in rows:",
                  "        start = 0",
                  '        for length in row["seq_lengths"]:',
                  '            examples.append({key: row[key][start:start + length] for key in ("input_ids", '
                  '"labels")})',
                  "            start += length",
                  "    return flatten(examples)",
                  "",
                  ""]
    return lines


def _trainer(recipe: Recipe) -> list[str]:
    optimizer = ""
    if recipe.optimizer is not None:
        name, arguments = recipe.optimizer
        optimizer = f", optimizer_cls_and_kwargs=(torch.optim.{name}, {literal(arguments)})"
    if recipe.trainer == "sft":
        lines = [f"trainer = SFTTrainer(model=model, args=args, train_dataset=train_dataset, "
                 f"processing_class=tokenizer{optimizer})"]
        if recipe.truncate_to:
            lines += ["# Cut each prepared example as the run cut it (TRL's padding-free without packing leaves it to "
                      "the data)",
                      "trainer.train_dataset = trainer.train_dataset.map(",
                      f"    lambda row: {{\"input_ids\": row[\"input_ids\"][:{recipe.truncate_to}], "
                      f"\"labels\": row[\"labels\"][:{recipe.truncate_to}]}})"]
        return lines
    lines = []
    if not recipe.packed_rows:  # (packed rows: data_collator is defined with the data)
        collator, note = COLLATOR_LINES[recipe.layout]
        lines.append(f"data_collator = {collator}  # {note}")
    return lines + [f"trainer = Trainer(model=model, args=args, train_dataset=train_dataset, "
                    f"data_collator=data_collator{optimizer})"]


def script(recipe: Recipe, steps: int, command: str) -> str:
    """The script's text (ends with a newline)."""
    config_class = "SFTConfig" if recipe.trainer == "sft" else "TrainingArguments"
    lines = [*_header(recipe, steps, command), "", *_imports(recipe), "",
             "HERE = Path(__file__).resolve().parent", *_model(recipe), "", *_data(recipe)]
    if lines[-1]:
        lines.append("")
    lines += [f"args = {config_class}(", *_arguments(recipe), ")", *_trainer(recipe), "trainer.train()",
              "# The Trainer's logged loss of every step (its log_history keeps the float), as a JSON list on the "
              "last line",
              'print(json.dumps([entry["loss"] for entry in trainer.state.log_history if "loss" in entry]))']
    return "\n".join(lines) + "\n"


def scripts(document: dict) -> dict[str, str]:
    """Each result's script by collator, for a document that has recipes (recipe.has_recipe), else none."""
    if not has_recipe(document):
        return {}
    command = command_line(document["config"])
    return {result["collator"]: script(recipe_of(document, result["collator"]), document["config"]["steps"], command)
            for result in document["results"]}


def with_code(document: dict) -> dict:
    """The document with each result's script as its `code` (None for a run saved before scripts)."""
    code = scripts(document)
    return {**document, "results": [{**result, "code": code.get(result["collator"])}
                                    for result in document["results"]]}
