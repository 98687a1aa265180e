"""Shared links: a read-only copy of one run that anyone with its link (`?shared=<token>`) can open, until the visitor
who shared it revokes it. Every other run stays as private as the history keeps it (serving/history_view.py).

The token is `secrets.token_urlsafe(24)`: 192 random bits, not guessable and not derived from the run. Only its
SHA-256 is stored, as the name of the copy's file under `<data dir>/shared/`, so the data dir holds nothing that
opens a link; the owner is the sharing session's opaque key (serving/sessions.py). The copy leaves out the text of an
uploaded dataset (the examples a run shows as trained): a private run's data is its visitor's, sharing its numbers
is not sharing its text. Files are written whole and renamed into place, so a reader never sees half a copy.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import secrets
from pathlib import Path

from serving.history import HistoryEntry

SHARED_FOLDER = "shared"
TOKEN_BYTES = 24
SHARED_PARAMETER, RUN_PARAMETER = "shared", "run"  # the page's query parameters: ?shared=<token>, ?run=<run id>


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def without_uploaded_text(document: dict) -> dict:
    """The run's numbers without the text of its examples (`dataset_stats.examples`)."""
    stats = {key: value for key, value in document.get("dataset_stats", {}).items() if key != "examples"}
    return {**document, "dataset_stats": stats}


@dataclasses.dataclass(frozen=True)
class SharedRun:
    run_id: str  # the run it copies
    owner: str  # the sharing session's key
    shared_at: str  # ISO 8601, UTC
    document: dict
    private: bool  # copied from a private run (its uploaded text left out)


class SharedRuns:
    def __init__(self, directory: str | os.PathLike):
        self.folder = Path(directory) / SHARED_FOLDER

    def _path(self, token: str) -> Path | None:
        """Where a token's copy lies; None for a value that cannot be a token (no path is built from it)."""
        if not isinstance(token, str) or not 16 <= len(token) <= 64:
            return None
        return self.folder / f"{_digest(token)}.json"

    def share(self, entry: HistoryEntry, owner: str) -> str:
        """A copy of `entry` reachable by the returned token."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        document = without_uploaded_text(entry.document) if entry.private else entry.document
        shared = SharedRun(entry.run_id, owner,
                           datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), document,
                           entry.private)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(token)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(dataclasses.asdict(shared), separators=(",", ":")))
        os.replace(temporary, path)
        return token

    def open(self, token: str) -> SharedRun | None:
        path = self._path(token)
        if path is None or not path.is_file():
            return None
        return SharedRun(**json.loads(path.read_text()))

    def revoke(self, token: str, owner: str) -> bool:
        """Removes the copy if `owner` shared it; False otherwise (no such link, or another visitor's: the same
        answer, so that revoking cannot probe for links)."""
        shared = self.open(token)
        if shared is None or shared.owner != owner:
            return False
        self._path(token).unlink(missing_ok=True)
        return True
