"""A visitor's uploaded dataset: used under its file name only, deleted from the server after the run that used it.

Gradio keeps an upload at `<upload folder>/<sha256(server seed + content)>/<file name>` and serves every file under
that folder at `/gradio_api/file=<path>` to anyone who asks for it: the unguessable folder name is all that keeps an
upload private. So the path never leaves the server (documents record the file name, size and SHA-256; log records
have upload paths replaced), the file is deleted as soon as the run that used it ends, and Gradio's `delete_cache`
sweep (`sweep_schedule`) removes uploads nobody ran, together with the copies of downloads Gradio serves.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

from gradio.utils import get_upload_folder

from demo_core import DemoInputError
from demo_core.config import env_number

MAX_AGE_ENV = "PACKING_LAB_UPLOAD_MAX_AGE_S"
DEFAULT_MAX_AGE_S = 3600


def upload_folder() -> Path:
    return Path(get_upload_folder()).resolve()


def max_age_s() -> int:
    return int(env_number(MAX_AGE_ENV, DEFAULT_MAX_AGE_S, whole=True))


def sweep_schedule() -> tuple[int, int]:
    """Gradio's `delete_cache` (every N seconds, delete the files this app created more than M seconds ago)."""
    age_s = max_age_s()
    return min(age_s, 600), age_s


@dataclasses.dataclass(frozen=True)
class Upload:
    path: Path  # inside Gradio's upload folder; private to the server

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    def from_value(cls, value) -> "Upload | None":
        """The page's `gr.File` gives a path, the API a FileData dict (`gradio_client.handle_file`); None: no file."""
        if not value:
            return None
        raw = value.get("path") if isinstance(value, dict) else value
        if not isinstance(raw, str) or not raw:
            raise DemoInputError("dataset_file must be a file sent with gradio_client.handle_file(path)")
        path = Path(raw)
        # Gradio only hands over files that came through its upload route; checking again keeps a path a client
        # named from ever being read, should that change.
        if not path.resolve().is_relative_to(upload_folder()):
            raise DemoInputError("dataset_file must be a file sent with gradio_client.handle_file(path)")
        if not path.is_file():
            raise DemoInputError(
                f"the uploaded file {path.name!r} is no longer on the server (uploads are deleted after the run that "
                f"used them, and unused ones after {max_age_s() // 60} minutes): upload it again")
        return cls(path)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
        try:
            self.path.parent.rmdir()  # Gradio's per-file folder, now empty
        except OSError:
            pass  # not empty (another file with the same content name) or already gone


class RedactUploadPaths(logging.Filter):
    """Replaces paths under the upload folder in a log record (message and traceback) with `<upload>/<file name>`."""

    def __init__(self):
        super().__init__()
        folders = {get_upload_folder(), str(upload_folder())}
        prefix = "|".join(re.escape(folder) for folder in folders)
        self.pattern = re.compile(rf"(?:{prefix})/(?:[^/\s'\"]+/)*([^/\s'\"]+)")

    def redact(self, text: str) -> str:
        return self.pattern.sub(r"<upload>/\1", text)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True
