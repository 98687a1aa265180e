"""A visitor's inputs (the page's widgets or the API's parameters) turned into a prepared run.

Local files a visitor may name in the model and dataset fields are only those under the allowed roots:
PACKING_LAB_ALLOWED_ROOTS (`:`-separated), by default the data dir. Not Gradio's upload folder: the files there are
other visitors' uploads, which reach a run only through the file parameter of their own session.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import demo_core
from demo_core import DemoInputError, Limits, RunConfig
from demo_core.batch_semantics import as_per_device
from serving.history import data_dir
from serving.uploads import Upload, upload_folder

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
    # Gradio's upload folder holds other visitors' files: never readable by name, even under an allowed root (a
    # data dir under /tmp, say).
    inside_uploads = resolved.is_relative_to(upload_folder())
    if inside_uploads or not any(resolved.is_relative_to(root) for root in allowed_roots()):
        raise DemoInputError(
            f"{what} path {value.strip()!r} is outside the folders this app may read; upload the file instead, or "
            f"ask the operator to add its folder to {ALLOWED_ROOTS_ENV}")


def prepare(limits: Limits, upload: Upload | None, **settings) -> demo_core.Prepared:
    """The one way the page and the API start a run or a preview, from the settings by name (those not given keep
    RunConfig's defaults). An uploaded file replaces the dataset field and is recorded by its name (the engine adds
    size and SHA-256); everything else is validated by the engine."""
    check_local_path(settings.get("model"), "model")
    if upload is None:
        check_local_path(settings.get("dataset"), "dataset", (".json", ".jsonl"))
    else:
        settings["dataset"] = upload.name
    return demo_core.prepare(RunConfig(**settings), limits, dataset_file=None if upload is None else upload.path)


def config_from_document(document: dict) -> RunConfig:
    """The config a saved run was made with (to redraw its batch), its local model and data paths held to the same
    allowed roots as typed ones (the roots may have narrowed since the run)."""
    names = {field.name for field in dataclasses.fields(RunConfig)}
    # a run saved before batch size meant per device: its micro-batch, so that the same batch is drawn
    config = RunConfig(**{key: value for key, value in as_per_device(document["config"]).items() if key in names})
    check_local_path(config.model, "model")
    check_local_path(config.dataset, "dataset", (".json", ".jsonl"))
    return config
