"""Run history: every finished comparison as one JSON line in `<data dir>/history.jsonl`.

The data dir is `PACKING_LAB_DATA_DIR` (default `./data`). Appends are line-safe: one `os.write` of a whole line
(with O_APPEND, so concurrent writers never interleave inside a line) followed by fsync. If the server dies in the
middle of a write, at worst the last line is torn; readers skip an unreadable line with a warning, and the next
append starts on a fresh line so it is not glued to the torn one.

Each entry may name its `owner` (an opaque key of the visitor who made it) and be `private` (listed to its owner
only: a run on a visitor's own file). Deleting rewrites the file to a temporary one and renames it over the old, so a
crash leaves either the old or the new file whole; one server process writes the history (the app's ZeroGPU worker
only trains and hands its documents back), so a lock inside the process orders appends and rewrites.
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
    owner: str | None = None  # who made it (an opaque key), None when nobody is recorded
    private: bool = False  # listed to its owner only

    def visible_to(self, viewer: str | None) -> bool:
        return not self.private or (viewer is not None and viewer == self.owner)


class RunHistory:
    def __init__(self, directory: str | os.PathLike | None = None):
        self.path = Path(directory if directory is not None else data_dir()) / HISTORY_FILE_NAME
        self._lock = threading.Lock()  # orders appends and rewrites in this process (O_APPEND covers other appenders)
        # The parsed file and the (inode, size, mtime) it was read at: every preview (its predicted time), history
        # table and run reads the history, and parsing a few hundred runs takes a tenth of a second. An append
        # changes the size and a rewrite the inode (it renames a new file over the old), so a stale parse is never
        # served. The entries are shared between readers: read them, never change them.
        self._parsed: tuple[tuple[int, int, int], list[tuple[bytes, HistoryEntry | None]]] | None = None

    def append(self, document: dict, owner: str | None = None, private: bool = False) -> HistoryEntry:
        entry = HistoryEntry(uuid.uuid4().hex[:12],
                             datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), document,
                             owner, private)
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

    def _lines(self) -> list[tuple[bytes, HistoryEntry | None]]:
        """Every non-empty line with its entry (None for an unreadable line), parsed again only when the file
        changed."""
        try:
            with self.path.open("rb") as handle:
                stat = os.fstat(handle.fileno())
                version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                parsed = self._parsed
                if parsed is not None and parsed[0] == version:
                    return parsed[1]
                content = handle.read()
        except FileNotFoundError:
            return []
        lines = self._parse(content)
        self._parsed = (version, lines)
        return lines

    def _parse(self, content: bytes) -> list[tuple[bytes, HistoryEntry | None]]:
        lines = []
        for number, raw in enumerate(content.split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                entry = HistoryEntry(record["run_id"], record["saved_at"], record["document"],
                                     record.get("owner"), bool(record.get("private", False)))
            except (ValueError, KeyError, TypeError):
                logger.warning("skipping unreadable line %d of %s (a write cut short by a crash?)", number, self.path)
                entry = None
            lines.append((raw, entry))
        return lines

    def entries(self) -> list[HistoryEntry]:
        """All readable entries, oldest first."""
        return [entry for _, entry in self._lines() if entry is not None]

    def visible_to(self, viewer: str | None) -> list[HistoryEntry]:
        """The entries `viewer` may list: everyone's shared runs and the viewer's own private ones, oldest first."""
        return [entry for entry in self.entries() if entry.visible_to(viewer)]

    def get(self, run_id: str) -> HistoryEntry | None:
        return next((entry for entry in self.entries() if entry.run_id == run_id), None)

    def delete(self, owner: str, run_ids: set[str] | None = None) -> list[str]:
        """Deletes `owner`'s entries (only those in `run_ids` when given) and returns their run ids."""
        with self._lock:
            kept, deleted = [], []
            for raw, entry in self._lines():
                if entry is not None and entry.owner == owner and (run_ids is None or entry.run_id in run_ids):
                    deleted.append(entry.run_id)
                else:
                    kept.append(raw)
            if deleted:
                temporary = self.path.with_name(self.path.name + ".rewrite")
                with temporary.open("wb") as handle:
                    handle.write(b"".join(raw + b"\n" for raw in kept))
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, self.path)
        return deleted
