"""Reading a data file or a hub dataset into raw records, each with where it came from ("data.jsonl line 7").

Reads what `datasets.load_dataset("json", data_files=...)` reads (measured with datasets 5.2): a UTF-8 byte-order
mark, JSON Lines whatever the suffix (`.json`, `.jsonl`, `.ndjson`, any case), objects pretty-printed over several
lines one after another, a top-level list of objects or of strings (a string is a `text` record, as datasets reads
it). It also reads records kept under one top-level key (`{"train": [...]}`, `{"data": [...]}`), as datasets reads
them when told the key (`field=`; without it datasets gives one row holding the whole list). Unlike datasets, one
line that is not valid JSON does not refuse the file: the line is skipped and named in a note, and only a file with no
readable record is refused. A broken top-level list is refused: its items cannot be told apart safely.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from demo_core.data.schemas import RECORD_COLUMNS
from demo_core.errors import DemoInputError
from demo_core.models import hub

FILE_SUFFIXES = (".json", ".jsonl", ".ndjson")  # compared lower-case: `.JSONL` is a data file too
BYTE_ORDER_MARK = "\ufeff"


@dataclasses.dataclass(frozen=True)
class RawRecord:
    where: str  # "data.jsonl line 7", "org/dataset row 12": how messages name the record
    value: Any


@dataclasses.dataclass
class ReadFile:
    records: list[RawRecord]
    unreadable: list[str]  # "line 9: not valid JSON (Expecting ',' delimiter)", one per skipped line


def is_data_file(path: Path) -> bool:
    return path.suffix.lower() in FILE_SUFFIXES


def _decode(path: Path, max_bytes: int | None) -> str:
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
    return content.removeprefix(BYTE_ORDER_MARK)


class _Lines:
    """Line numbers (1-based) of character offsets in one text."""

    def __init__(self, text: str):
        self._newlines = [match.start() for match in re.finditer("\n", text)]

    def at(self, offset: int) -> int:
        return bisect.bisect_left(self._newlines, offset) + 1


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


_DECODER = json.JSONDecoder()


def _stream(text: str, lines: _Lines) -> list[tuple[int, Any]]:
    """(line, value) of each JSON value in a whitespace-separated stream; JSONDecodeError at the first bad one."""
    values, index = [], _skip_space(text, 0)
    while index < len(text):
        value, end = _DECODER.raw_decode(text, index)
        values.append((lines.at(index), value))
        index = _skip_space(text, end)
    return values


def _list_items(text: str, lines: _Lines) -> list[tuple[int, Any]]:
    """(line, item) of a top-level JSON list, each item's own line (json.loads would lose them)."""
    items, index = [], _skip_space(text, 1)
    while index < len(text) and text[index] != "]":
        item, end = _DECODER.raw_decode(text, index)
        items.append((lines.at(index), item))
        index = _skip_space(text, end)
        if index < len(text) and text[index] == ",":
            index = _skip_space(text, index + 1)
        elif index >= len(text) or text[index] != "]":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, index)
    if index >= len(text) or _skip_space(text, index + 1) != len(text):
        raise json.JSONDecodeError("Expecting a single list", text, min(index, len(text) - 1))
    return items


def _records_under_a_key(path: Path, line: int, value: dict) -> list[tuple[int, Any]] | None:
    """The records of a file that keeps them under one top-level key (`{"train": [...]}`, `{"version": 1, "data":
    [...]}`), as datasets' JSON loader reads them with `field=`; None when the object is one record itself (a
    conversation's `messages` is a list of objects too). Several such keys are refused: which one trains is the
    file owner's choice, not a guess."""
    if any(column in value for column in RECORD_COLUMNS):
        return None
    lists = {key: items for key, items in value.items()
             if isinstance(items, list) and items and all(isinstance(item, dict) for item in items)}
    if len(lists) > 1:
        raise DemoInputError(f"{path.name} keeps records under several keys ({', '.join(lists)}): keep one, as "
                             f"datasets' JSON loader reads one with field=")
    return [(line, item) for item in next(iter(lists.values()))] if lists else None


def _line_by_line(text: str) -> tuple[list[tuple[int, Any]], list[str]]:
    """JSON Lines read one line at a time: a line that does not parse is skipped and named."""
    values, unreadable = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            unreadable.append(f"line {number}: not valid JSON ({error.msg})")
    return values, unreadable


def read_file(path: Path, max_bytes: int | None = None) -> ReadFile:
    """The records of a JSON or JSON Lines file (see the module docstring for what is read, skipped or refused)."""
    text = _decode(path, max_bytes)
    lines, unreadable = _Lines(text), []
    start = _skip_space(text, 0)
    try:
        if text.startswith("[", start):
            values = _list_items(text, lines)
        else:
            values = _stream(text, lines)
    except json.JSONDecodeError as error:
        if text.startswith("[", start):
            raise DemoInputError(f"{path.name} line {error.lineno}: not valid JSON ({error.msg})") from None
        values, unreadable = _line_by_line(text)
        if not values:
            raise DemoInputError(f"{path.name} line {error.lineno}: not valid JSON ({error.msg})") from None
    if len(values) == 1 and isinstance(values[0][1], dict):
        values = _records_under_a_key(path, values[0][0], values[0][1]) or values
    if not values:
        raise DemoInputError(f"dataset file {path.name!r} holds no records")
    return ReadFile([RawRecord(f"{path.name} line {line}", value) for line, value in values], unreadable)


def file_record(path: Path) -> dict:
    """How a run records its data file: name, size and SHA-256, never where it lay (an upload's server path is
    private to the server; the hash still tells two files apart)."""
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"name": path.name, "size_bytes": path.stat().st_size, "sha256": digest}


def read_hub(dataset_id: str, builtin_names: tuple[str, ...]) -> list[RawRecord]:
    """The train split of a hub dataset (works offline only for datasets already in the local cache)."""
    import datasets

    # Without a network datasets' hub client retries for ~20 s before it fails: ask the hub once first (hub.py).
    reason = hub.offline_reason()
    if reason is not None and not hub.dataset_in_cache(dataset_id):
        raise DemoInputError(f"cannot load dataset {dataset_id!r}: not a built-in ({', '.join(builtin_names)}), not an "
                             f"existing file, and {hub.not_cached(dataset_id, reason, '--repo-type', 'dataset')}")
    try:
        dataset = datasets.load_dataset(dataset_id, split="train")
    except Exception as error:  # datasets raises many types (ConnectionError, FileNotFoundError, DatasetNotFoundError)
        raise DemoInputError(
            f"cannot load dataset {dataset_id!r}: not a built-in ({', '.join(builtin_names)}), "
            f"not an existing file, and not a loadable hub dataset ({type(error).__name__})"
        ) from None
    return [RawRecord(f"{dataset_id} row {index}", row) for index, row in enumerate(dataset)]
