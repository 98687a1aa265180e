"""A run's downloads (its JSON document and results CSV), written where Gradio copies them from to serve them.

Gradio serves a handler's returned file from a copy in its own cache folder, under a name derived from a secret seed
and the content, and only the session the handler answered is given that name; the copies go with Gradio's
`delete_cache` sweep. The originals here go when their run is deleted.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import demo_core
from presentation import report

DOWNLOAD_DIR = Path(tempfile.gettempdir()) / "packing-lab-downloads"


def write(document: dict, run_id: str) -> tuple[str, str]:
    """(JSON path, CSV path) of a run's downloads."""
    folder = DOWNLOAD_DIR / run_id
    folder.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = folder / f"packing-lab-{run_id}.json", folder / f"packing-lab-{run_id}.csv"
    demo_core.write_json(document, json_path)
    csv_path.write_text(report.results_csv(document))
    return str(json_path), str(csv_path)


def forget(run_ids: list[str]) -> None:
    for run_id in run_ids:
        shutil.rmtree(DOWNLOAD_DIR / run_id, ignore_errors=True)
