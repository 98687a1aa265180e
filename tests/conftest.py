"""Test session settings: no network and no telemetry, as the app runs here.

Set before anything imports huggingface_hub or gradio, which read these variables once at import.
"""

import os
import socket
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def lab_app(tmp_path_factory):
    """The Gradio app (module `app`), launched once in this process on a free port, its data dir a temporary folder.

    Shared by the API and browser tests: launching costs several seconds, and one server also proves that runs
    from different clients land in the same history.
    """
    data_dir: Path = tmp_path_factory.mktemp("packing-lab-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACKING_LAB_DATA_DIR", str(data_dir))  # allowed roots and history both follow it
        import app
        from demo_core.history import RunHistory

        patch.setattr(app, "HISTORY", RunHistory(data_dir))
        app.launch(prevent_thread_lock=True, server_port=_free_port(), quiet=True)
        yield app
        app.demo.close()
