"""Test session settings: no network and no telemetry, as the app runs here.

Set before anything imports huggingface_hub or gradio, which read these variables once at import.
"""

import os
import socket
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import demo_core  # noqa: E402  (after the variables: it imports huggingface_hub)

from chromium import launch_chromium  # noqa: E402

pytest_plugins = ["memory_log"]  # PACKING_LAB_MEMORY_LOG=<file>: resident memory after every test (memory_log.py)


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
        from serving.history import RunHistory
        from serving.sharing import SharedRuns

        patch.setattr(app, "HISTORY", RunHistory(data_dir))
        patch.setattr(app, "SHARES", SharedRuns(data_dir))
        app.launch(prevent_thread_lock=True, server_port=_free_port(), quiet=True)
        yield app
        app.demo.close()


@pytest.fixture(scope="module")
def browser(lab_app):
    """Chromium, one per test file that asks for it, pointed at nothing yet (each test opens its own tabs)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture(autouse=True, scope="module")
def release_what_the_file_built():
    """After each test file, the engine's caches are emptied and freed memory goes back to the system: what one file
    fitted, checked or built never stays resident under the next (the suite's peak is its largest file's, not the
    sum of them)."""
    yield
    demo_core.release_caches()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models are all per-op overhead: one thread skips OpenMP's synchronisation, which on a busy 2-core box
    costs more than the second core gives (a 10-step, 3-collator tiny-llama run: 5.8 s instead of 15.7 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
