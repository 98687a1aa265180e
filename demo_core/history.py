"""Run history: every finished comparison as one JSON line in `<data dir>/history.jsonl`.

The data dir is `PACKING_LAB_DATA_DIR` (default `./data`). Appends are line-safe: one `os.write` of a whole line
(with O_APPEND, so concurrent writers never interleave inside a line) followed by fsync. If the server dies in the
middle of a write, at worst the last line is torn; readers skip an unreadable line with a warning, and the next
append starts on a fresh line so it is not glued to the torn one.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import threading
import uuid
from pathlib import Path

DATA_DIR_ENV = "PACKING_LAB_DATA_DIR"
HISTORY_FILE_NAME = "history.jsonl"

logger = logging.getLogger(__name__)


def data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or "data").expanduser()


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    run_id: str
    saved_at: str  # ISO 8601, UTC, seconds
    document: dict  # the engine's JSON document (Comparison.to_dict())


class RunHistory:
    def __init__(self, directory: str | os.PathLike | None = None):
        self.path = Path(directory if directory is not None else data_dir()) / HISTORY_FILE_NAME
        self._lock = threading.Lock()  # one appender at a time inside this process (O_APPEND covers other processes)

    def append(self, document: dict) -> HistoryEntry:
        entry = HistoryEntry(uuid.uuid4().hex[:12],
                             datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), document)
        line = (json.dumps(dataclasses.asdict(entry), separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # the previous write was torn: leave its fragment on a line of its own
                written = os.write(fd, line)
                if written != len(line):  # regular files take a whole write; anything else is a full disk
                    raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes (disk full?)")
                os.fsync(fd)
            finally:
                os.close(fd)
        return entry

    def entries(self) -> list[HistoryEntry]:
        """All readable entries, oldest first."""
        try:
            content = self.path.read_bytes()
        except FileNotFoundError:
            return []
        entries = []
        for number, raw in enumerate(content.split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                entries.append(HistoryEntry(record["run_id"], record["saved_at"], record["document"]))
            except (ValueError, KeyError, TypeError):
                logger.warning("skipping unreadable line %d of %s (a write cut short by a crash?)", number, self.path)
        return entries

    def get(self, run_id: str) -> HistoryEntry | None:
        return next((entry for entry in self.entries() if entry.run_id == run_id), None)
