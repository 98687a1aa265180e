"""Local files a visitor may name in the model and dataset fields: only those under the allowed roots.

The roots are PACKING_LAB_ALLOWED_ROOTS (`:`-separated), by default the data dir. Not Gradio's upload folder:
the files there are other visitors' uploads, which reach a run only through the file parameter of their own session.
"""

from __future__ import annotations

import os
from pathlib import Path

from demo_core import DemoInputError, data_dir

ALLOWED_ROOTS_ENV = "PACKING_LAB_ALLOWED_ROOTS"


def allowed_roots() -> list[Path]:
    raw = os.environ.get(ALLOWED_ROOTS_ENV)
    roots = [Path(part) for part in raw.split(os.pathsep) if part] if raw else [data_dir()]
    return [root.expanduser().resolve() for root in roots]


def check_local_path(value, what: str, file_suffixes: tuple[str, ...] = ()) -> None:
    """Refuses a local path outside the allowed roots. The engine reads a value as a path when it exists (or, for
    data, ends in .json/.jsonl), otherwise as a hub id; the same test here decides what needs checking."""
    if not isinstance(value, str) or not value.strip():
        return  # the engine's own validation names the empty field
    path = Path(value.strip()).expanduser()
    if not (path.exists() or path.suffix in file_suffixes):
        return
    resolved = path.resolve()  # follows symlinks, so a link inside a root cannot point outside it
    if not any(resolved.is_relative_to(root) for root in allowed_roots()):
        raise DemoInputError(
            f"{what} path {value.strip()!r} is outside the folders this app may read; upload the file instead, or "
            f"ask the operator to add its folder to {ALLOWED_ROOTS_ENV}")
