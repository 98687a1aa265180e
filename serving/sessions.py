"""A visitor as the server's files know it: an opaque key per Gradio session, and that session's Stop.

Gradio gives every browser tab (each page load) and every API client a random `session_hash`, which the client
presents on every call. The history records a SHA-256 of it as a run's owner, never the hash itself, so the history
file holds nothing that would let someone act as that session. A session's Stop is a pair of marker files under the
temp folder: "running" for as long as the session has a run, "stop" once Stop is clicked. Files, not an Event in
memory, because the run may be training in another process (a forked ZeroGPU worker) than the one that handles the
Stop click.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

MARKER_DIR = Path(tempfile.gettempdir()) / "packing-lab-sessions"


@dataclasses.dataclass(frozen=True)
class Session:
    key: str  # SHA-256 of the session hash (a random one for a call made outside any session)

    @classmethod
    def of(cls, request) -> "Session":
        session_hash = getattr(request, "session_hash", None) or uuid.uuid4().hex
        return cls(hashlib.sha256(session_hash.encode()).hexdigest()[:32])

    @property
    def stop_marker(self) -> Path:
        return MARKER_DIR / f"{self.key}.stop"

    @property
    def running_marker(self) -> Path:
        return MARKER_DIR / f"{self.key}.running"

    @contextlib.contextmanager
    def running(self) -> Iterator[Path]:
        """Marks the session as running a run for the block's duration; yields the stop marker that run polls."""
        MARKER_DIR.mkdir(parents=True, exist_ok=True)
        self.stop_marker.unlink(missing_ok=True)  # a Stop clicked while nothing ran does not stop this run
        self.running_marker.touch()
        try:
            yield self.stop_marker
        finally:
            self.running_marker.unlink(missing_ok=True)
            self.stop_marker.unlink(missing_ok=True)

    def request_stop(self) -> bool:
        """Asks this session's run to stop after its current step; False when it has none."""
        if not self.running_marker.exists():
            return False
        self.stop_marker.touch()
        return True
