"""Data: built-in datasets, JSON/JSONL files, hub datasets; sampling, tokenization as TRL does it, length statistics.

`readers.py` reads a file (or a hub dataset) into raw records, `schemas.py` reads each one as one of TRL's SFT layouts
(or says why it cannot), `rendering.py` tokenizes it as SFTTrainer does and marks the tokens that carry loss. Here:
which records a run trains on (the file's layout, the sample in seeded order), truncation, and the notes that say what
was left out and why: no record's text is dropped without one.

The two built-ins imitate the length shapes of the datasets in the packing blog post (FLAN: many short tasks with a
heavy tail; OrcaMath: arithmetic word problems of similar length) with readable, learnable text, generated
deterministically from the seed, as TRL `text` records. With the byte-level preset tokenizer one token is one byte,
so the generators target character counts directly.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from demo_core.data.readers import RawRecord, file_record, is_data_file, read_file, read_hub
from demo_core.data.rendering import resolve_loss_on, shown_example, tokenize, trained_tokens, training_chat_template
from demo_core.data.schemas import CONVERSATIONAL, TEXT, BlankRecord, RecordProblem, SFTRecord, sft_record
from demo_core.errors import DemoInputError
from demo_core.models.sources import CHAT_TEMPLATE

BUILTIN_DATASETS = ("flan-like", "orcamath-like")

_NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()
_COUNTRIES = {
    "France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Canada": "Ottawa",
    "Egypt": "Cairo", "Norway": "Oslo", "Chile": "Santiago", "India": "New Delhi", "Spain": "Madrid",
}
_ADJECTIVES = "good great fine bad awful dull bright calm".split()
_POSITIVE = {"good", "great", "fine", "bright", "calm"}
_NOUNS = "film meal trip book song game class walk".split()
_NAMES = "Ana Ben Chen Dina Eli Farah Goro Hana Ivan Jade".split()
_ITEMS = "apples pencils marbles stickers cookies coins books shells".split()


def _flan_filler(rng: random.Random, target_chars: int) -> str:
    """Long FLAN-style inputs: a passage of simple, regular sentences to summarise or answer from."""
    sentences = []
    while sum(len(s) + 1 for s in sentences) < target_chars:
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        count = rng.randint(2, 12)
        sentences.append(f"{name} has {_NUMBER_WORDS[count]} {item}.")
    return " ".join(sentences)


def _flan_example(rng: random.Random) -> str:
    # Log-normal lengths (median ≈ 100 bytes, sigma 0.85) give FLAN's heavy tail: p99 ≈ 7x the median.
    target_chars = int(min(4000, max(24, rng.lognormvariate(math.log(100), 0.85))))
    task = rng.randrange(4)
    if task == 0:
        country = rng.choice(list(_COUNTRIES))
        prompt, answer = f"Question: What is the capital of {country}?", f"Answer: {_COUNTRIES[country]}."
    elif task == 1:
        adjective, noun = rng.choice(_ADJECTIVES), rng.choice(_NOUNS)
        sentiment = "positive" if adjective in _POSITIVE else "negative"
        prompt, answer = f"Review: The {noun} was {adjective}. Sentiment?", f"Answer: {sentiment}."
    elif task == 2:
        a, b = rng.randint(0, 6), rng.randint(0, 6)
        prompt, answer = f"Add {_NUMBER_WORDS[a]} and {_NUMBER_WORDS[b]}.", f"Answer: {_NUMBER_WORDS[a + b]}."
    else:
        name = rng.choice(_NAMES)
        prompt, answer = f"Task: Count to {name}'s number.", f"Answer: {' '.join(_NUMBER_WORDS[1:rng.randint(3, 12)])}."
    filler_chars = target_chars - len(prompt) - len(answer) - 2
    if filler_chars > 20:
        prompt = f"Context: {_flan_filler(rng, filler_chars)}\n{prompt}"
    return f"{prompt}\n{answer}"


def _orcamath_example(rng: random.Random) -> str:
    # Worked solutions with a step count drawn so the length is ≈ normal(400, 50) bytes: OrcaMath's narrow spread.
    target_chars = max(200, int(rng.gauss(425, 50)))
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    total = rng.randint(5, 40)
    lines = [f"Problem: {name} starts with {total} {item}. Follow the changes and find how many remain.", "Solution:"]
    step = 1
    while sum(len(line) + 1 for line in lines) < target_chars - 60:
        amount = rng.randint(1, 9)
        if rng.random() < 0.5 or total - amount < 0:
            lines.append(f"Step {step}: {name} gets {amount} more, so {total} + {amount} = {total + amount}.")
            total += amount
        else:
            lines.append(f"Step {step}: {name} gives away {amount}, so {total} - {amount} = {total - amount}.")
            total -= amount
        step += 1
    lines.append(f"The answer is {total}.")
    return "\n".join(lines)


_GENERATORS = {"flan-like": _flan_example, "orcamath-like": _orcamath_example}


def builtin_records(name: str, count: int, seed: int) -> list[dict]:
    """TRL `text` records: every token carries loss, as in the blog's packing runs. (As prompt/completion, TRL's
    completion-only default would drop every example whose answer lies past max length: most of FLAN's tail.)"""
    rng = random.Random(f"{name}:{seed}")
    return [{"text": _GENERATORS[name](rng)} for _ in range(count)]


def _skipped_note(total: int, blank: list[str], problems: list[str]) -> str:
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    parts = ([f"{len(blank)} blank ({', '.join(blank[:3])}{', ...' if len(blank) > 3 else ''})"] if blank else []) + \
            ([f"{len(problems)} that cannot be trained on as they are: {shown}"] if problems else [])
    return f"skipped {len(blank) + len(problems)} of {total} records: " + ", ".join(parts)


def _trainable(raws: list[RawRecord], unreadable: list[str], name: str) -> tuple[list[SFTRecord], list[str]]:
    """The records of the file's layout (the most common one), and the notes on what was left out and why; refuses
    the file when no record can be trained on, with the first reason and its line."""
    usable, blank, problems = [], [], list(unreadable)
    for raw in raws:
        try:
            usable.append((raw.where, sft_record(raw.value)))
        except BlankRecord:
            blank.append(raw.where)
        except RecordProblem as problem:
            problems.append(f"{raw.where}: {problem}")
    layouts = collections.Counter(record.layout for _, record in usable)
    if len(layouts) > 1:
        layout = layouts.most_common(1)[0][0]
        problems += [f"{where}: {record.layout} data in a file of {layout} data (one run trains one layout)"
                     for where, record in usable if record.layout != layout]
        usable = [(where, record) for where, record in usable if record.layout == layout]
    if not usable:
        if not problems:
            raise DemoInputError(f"dataset {name!r} holds only blank records")
        more = f" (and {len(problems) - 1} more records that cannot be trained on)" if len(problems) > 1 else ""
        raise DemoInputError(problems[0] + more)
    records = [record for _, record in usable]
    notes = [_skipped_note(len(raws) + len(unreadable), blank, problems)] if blank or problems else []
    unused = collections.Counter(column for record in records for column in record.unused)
    if unused:
        notes.append("not trained on (text that no part of the layout reads): " +
                     ", ".join(f"{column} ({count} records)" for column, count in sorted(unused.items())))
    left_out = sum(record.left_out_parts for record in records)
    if left_out:
        notes.append(f"{left_out} content parts without text (images, audio, ...) were left out: the models here "
                     "read text")
    return records, notes


def load_records(dataset: str, samples: int, seed: int,
                 max_upload_bytes: int | None = None) -> tuple[list[SFTRecord], list[str], dict | None]:
    """(records sampled in training order, notes for the user, the `file_record` when the data is a file)."""
    if dataset in BUILTIN_DATASETS:
        return [SFTRecord(TEXT, fields) for fields in builtin_records(dataset, samples, seed)], [], None
    path, file = Path(dataset).expanduser(), None
    if is_data_file(path) or path.exists():
        read = read_file(path, max_upload_bytes)
        records, notes = _trainable(read.records, read.unreadable, path.name)
        file = file_record(path)
    else:
        records, notes = _trainable(read_hub(dataset, BUILTIN_DATASETS), [], dataset)
    if samples > len(records):
        notes.insert(0, f"asked for {samples} samples, the dataset has {len(records)}: used all {len(records)}")
        samples = len(records)
    order = random.Random(seed).sample(range(len(records)), samples)
    return [records[index] for index in order], notes, file


@dataclasses.dataclass
class LengthStats:
    count: int
    mean: float
    std: float
    min: int
    p50: float
    p90: float
    p99: float
    max: int
    truncated: int
    total_tokens: int

    @classmethod
    def of(cls, lengths: list[int], truncated: int = 0) -> "LengthStats":
        array = np.asarray(lengths, dtype=np.float64)
        return cls(
            count=len(lengths),
            mean=float(array.mean()),
            std=float(array.std()),
            min=int(array.min()),
            p50=float(np.percentile(array, 50)),
            p90=float(np.percentile(array, 90)),
            p99=float(np.percentile(array, 99)),
            max=int(array.max()),
            truncated=truncated,
            total_tokens=int(array.sum()),
        )


@dataclasses.dataclass
class TokenizedDataset:
    """Tokenized examples in training order (seeded), plus what was done to get them.

    `examples[i]` are the token ids, `labels[i]` the same ids where a token carries loss and -100 elsewhere, and
    `records[i]` the record in TRL's layout (what SFTTrainer tokenizes itself); `shown` the first examples as trained.
    """

    name: str
    examples: list[list[int]]
    stats: LengthStats
    notes: list[str]
    file: dict | None = None  # `file_record` of a data file
    labels: list[list[int]] = dataclasses.field(default_factory=list)
    records: list[dict] = dataclasses.field(default_factory=list)
    layout: str = TEXT
    loss_on: str = "all"  # resolved: all, completion or assistant
    shown: list[dict] = dataclasses.field(default_factory=list)

    @property
    def trained_tokens(self) -> int:
        return sum(trained_tokens(labels) for labels in self.labels)

    def stats_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self.stats), "trained_tokens": self.trained_tokens,
                "layout": self.layout, "loss_on": self.loss_on, "examples": self.shown, "notes": self.notes,
                **({"file": self.file} if self.file else {})}


SHOWN_EXAMPLES = 3  # the first examples as trained, in `dataset_stats.examples`


def _chat_template_note(tokenizer: PreTrainedTokenizerBase, layout: str) -> list[str]:
    """A tokenizer without a chat template renders conversations with Packing Lab's (models.CHAT_TEMPLATE), and
    says so: TRL would refuse them."""
    if layout not in CONVERSATIONAL or tokenizer.chat_template is not None:
        return []
    tokenizer.chat_template = CHAT_TEMPLATE
    return ["the tokenizer has no chat template: conversations are rendered with Packing Lab's built-in one "
            "(README: Data formats)"]


def load(dataset: str, tokenizer: PreTrainedTokenizerBase, samples: int, seed: int, max_length: int,
         max_upload_bytes: int | None = None, loss_on: str = "auto") -> TokenizedDataset:
    records, notes, file = load_records(dataset, samples, seed, max_upload_bytes)
    layout = records[0].layout
    loss_on = resolve_loss_on(loss_on, layout)
    notes += _chat_template_note(tokenizer, layout)
    template = training_chat_template(tokenizer, loss_on)
    examples, labels, kept, too_long, truncated = [], [], [], 0, 0
    for record in records:
        ids, record_labels = tokenize(record.fields, layout, tokenizer, loss_on, template)
        cut = len(ids) > max_length
        too_long += cut
        ids, record_labels = ids[:max_length], record_labels[:max_length]
        if trained_tokens(record_labels):  # else nothing to learn: a prompt that fills max length, one token
            truncated += cut
            examples.append(ids)
            labels.append(record_labels)
            kept.append(record.fields)
    if too_long == len(records) and len(records) > 1:
        raise DemoInputError(
            f"all {len(records)} examples are longer than max length {max_length}: raise max length "
            f"(packing has nothing to show when every example is cut to the same length)"
        )
    if not examples:
        raise DemoInputError(f"no example of {Path(dataset).name!r} has a token that carries loss (loss on "
                             f"{loss_on}) within max length {max_length}")
    if truncated:
        notes.append(f"{truncated} of {len(records)} examples were longer than {max_length} tokens and were truncated")
    if len(examples) < len(records):
        notes.append(f"{len(records) - len(examples)} of {len(records)} examples have no token that carries loss "
                     f"(loss on {loss_on}) within max length {max_length}: left out, as TRL leaves them out")
    lengths = [len(ids) for ids in examples]
    shown = [shown_example(tokenizer, ids, example_labels)
             for ids, example_labels in zip(examples[:SHOWN_EXAMPLES], labels)]
    return TokenizedDataset(Path(dataset).name if Path(dataset).suffix else dataset, examples,
                            LengthStats.of(lengths, truncated), notes, file, labels, kept, layout, loss_on, shown)
