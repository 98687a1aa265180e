"""Data: built-in length profiles, JSON/JSONL files, hub datasets; sampling, tokenization, length statistics.

The two built-ins imitate the length shapes of the datasets in the packing blog post (FLAN: many short tasks with a
heavy tail; OrcaMath: arithmetic word problems of similar length) with readable, learnable text, generated
deterministically from the seed. With the byte-level preset tokenizer one token is one byte, so the generators
target character counts directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from .errors import DemoInputError, offline_hint

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


def builtin_texts(name: str, count: int, seed: int) -> list[str]:
    rng = random.Random(f"{name}:{seed}")
    return [_GENERATORS[name](rng) for _ in range(count)]


# The columns of the common fine-tuning schemas (Alpaca, FLAN, OrcaMath, prompt/completion, chat), tried in order.
# Every prompt-like column present is kept, in this order (Alpaca's `instruction` and its optional `input`); then the
# first answer-like one.
PROMPT_COLUMNS = ("prompt", "instruction", "input", "inputs", "question", "query")
RESPONSE_COLUMNS = ("response", "output", "completion", "answer", "targets")
CHAT_COLUMNS = ("messages", "conversations")  # [{"role", "content"}] or ShareGPT's [{"from", "value"}]


def _message_text(message, where: str) -> str:
    """"role: content" of one chat message; content given as text parts ([{"type": "text", "text": ...}]) is
    joined, other parts (images) are left out."""
    role = content = None
    if isinstance(message, dict):
        role, content = message.get("role", message.get("from")), message.get("content", message.get("value"))
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(role, str) or not isinstance(content, str):
        raise DemoInputError(f"{where}: every message needs 'role' and 'content' (or ShareGPT's 'from' and 'value')")
    return f"{role}: {content}"


def _chat_text(messages: list, where: str) -> str:
    return "\n".join(_message_text(message, where) for message in messages)


def _record_text(record, where: str) -> str:
    """One training text from one record of any supported schema."""
    if not isinstance(record, dict):
        raise DemoInputError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if isinstance(record.get("text"), str):
        return record["text"]
    # TRL's conversational prompt/completion: both are lists of messages.
    if isinstance(record.get("prompt"), list) and isinstance(record.get("completion"), list):
        return _chat_text(record["prompt"] + record["completion"], where)
    prompt = "\n".join(record[column] for column in PROMPT_COLUMNS
                       if isinstance(record.get(column), str) and record[column])
    response = next((record[column] for column in RESPONSE_COLUMNS if isinstance(record.get(column), str)), None)
    if prompt and response is not None:
        return f"{prompt}\n{response}"
    for column in CHAT_COLUMNS:
        if isinstance(record.get(column), list) and record[column]:
            return _chat_text(record[column], where)
    raise DemoInputError(
        f"{where}: no usable text; give a 'text' column, a prompt ({'/'.join(PROMPT_COLUMNS)}) with an answer "
        f"({'/'.join(RESPONSE_COLUMNS)}), or chat 'messages'/'conversations' "
        f"(found columns: {', '.join(sorted(record)) or 'none'})"
    )


def file_texts(path: Path, max_bytes: int | None = None) -> list[str]:
    """Texts from a .jsonl (one object per line) or .json (a list of objects, or {"data": [...]}) file."""
    if not path.is_file():
        raise DemoInputError(f"dataset file {path.name!r} does not exist")
    size = path.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise DemoInputError(f"dataset file {path.name!r} is {size / 1e6:.1f} MB; the limit is {max_bytes / 1e6:.1f} MB")
    if size == 0:
        raise DemoInputError(f"dataset file {path.name!r} is empty")
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DemoInputError(f"dataset file {path.name!r} is not UTF-8 text (is it a JSON/JSONL file?)") from None
    if path.suffix == ".jsonl":
        texts = []
        for number, line in enumerate(content.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DemoInputError(f"{path.name} line {number}: not valid JSON ({error.msg})") from None
            texts.append(_record_text(record, f"{path.name} line {number}"))
    elif path.suffix == ".json":
        try:
            data = json.loads(content)
        except json.JSONDecodeError as error:
            raise DemoInputError(f"{path.name} line {error.lineno}: not valid JSON ({error.msg})") from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise DemoInputError(f"{path.name}: expected a list of objects (or {{\"data\": [...]}})")
        texts = [_record_text(record, f"{path.name} item {index}") for index, record in enumerate(data)]
    else:
        raise DemoInputError(f"dataset file {path.name!r}: use a .json or .jsonl file")
    if not texts:
        raise DemoInputError(f"dataset file {path.name!r} holds no records")
    return texts


def file_record(path: Path) -> dict:
    """How a run records its data file: name, size and SHA-256, never where it lay (an upload's server path is
    private to the server; the hash still tells two files apart)."""
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"name": path.name, "size_bytes": path.stat().st_size, "sha256": digest}


def hub_texts(dataset_id: str) -> list[str]:
    """The train split of a hub dataset (works offline only for datasets already in the local cache)."""
    import datasets

    try:
        dataset = datasets.load_dataset(dataset_id, split="train")
    except Exception as error:  # datasets raises many types (ConnectionError, FileNotFoundError, DatasetNotFoundError)
        hint = offline_hint("datasets")
        raise DemoInputError(
            f"cannot load dataset {dataset_id!r}{hint}: not a built-in ({', '.join(BUILTIN_DATASETS)}), "
            f"not an existing file, and not a loadable hub dataset ({type(error).__name__})"
        ) from None
    return [_record_text(row, f"{dataset_id} row {index}") for index, row in enumerate(dataset)]


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
    """Tokenized examples in training order (seeded), plus what was done to get them."""

    name: str
    examples: list[list[int]]
    stats: LengthStats
    notes: list[str]
    file: dict | None = None  # `file_record` of a data file

    def stats_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self.stats), "notes": self.notes,
                **({"file": self.file} if self.file else {})}


def load_texts(dataset: str, samples: int, seed: int,
               max_upload_bytes: int | None = None) -> tuple[list[str], list[str], dict | None]:
    """(texts sampled in training order, notes for the user, the `file_record` when the data is a file)."""
    notes, record = [], None
    if dataset in BUILTIN_DATASETS:
        return builtin_texts(dataset, samples, seed), notes, record
    path = Path(dataset).expanduser()
    if path.suffix in (".json", ".jsonl") or path.exists():
        texts = file_texts(path, max_upload_bytes)
        record = file_record(path)
    else:
        texts = hub_texts(dataset)
    if samples > len(texts):
        notes.append(f"asked for {samples} samples, the dataset has {len(texts)}: used all {len(texts)}")
        samples = len(texts)
    order = random.Random(seed).sample(range(len(texts)), samples)
    return [texts[index] for index in order], notes, record


def load(dataset: str, tokenizer: PreTrainedTokenizerBase, samples: int, seed: int, max_length: int,
         max_upload_bytes: int | None = None) -> TokenizedDataset:
    texts, notes, record = load_texts(dataset, samples, seed, max_upload_bytes)
    examples, truncated = [], 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        if len(ids) > max_length:
            truncated += 1
            ids = ids[:max_length]
        if len(ids) >= 2:  # one token has nothing to predict
            examples.append(ids)
    if not examples:
        raise DemoInputError(f"no example of {Path(dataset).name!r} has at least 2 tokens of text")
    if truncated == len(texts) and len(texts) > 1:
        raise DemoInputError(
            f"all {len(texts)} examples are longer than max length {max_length}: raise max length "
            f"(packing has nothing to show when every example is cut to the same length)"
        )
    if truncated:
        notes.append(f"{truncated} of {len(texts)} examples were longer than {max_length} tokens and were truncated")
    lengths = [len(ids) for ids in examples]
    return TokenizedDataset(Path(dataset).name if Path(dataset).suffix else dataset, examples,
                            LengthStats.of(lengths, truncated), notes, record)
