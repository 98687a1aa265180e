"""A short soak: runs back to back in one process leave nothing behind (benchmarks/soak.py is the long version).

Each run goes the way the app's Run button takes it: the engine in a fresh worker thread, then the result figures
drawn and encoded by Gradio's Plot component (which is what the page sends). Three checks:
- no model (hence no Trainer, which holds it) and no figure of a run is still alive after it (weak references);
- a finished run hands its freed heap back to the system (glibc keeps it otherwise, and a server's resident memory
  then steps up by a third over its first runs: see benchmarks/soak.py);
- resident memory after run 6 is within 10% of run 2.
"""

import ctypes
import gc
import sys
import threading
import weakref

import gradio as gr
import psutil
import pytest

import demo_core
from demo_core.models.sources import ModelSource
from presentation import plots

RUN = dict(collators=("padded", "flatten"), steps=2, batch_size=8)  # batch 8 of FLAN-like lengths: a 1024-token row


def run_like_the_app(index: int) -> list:
    """One comparison in a worker thread, its figures encoded; returns weak references to what the run made."""
    made, box = [], []
    config = demo_core.RunConfig(samples=20 + index, seed=index, **RUN)
    worker = threading.Thread(target=lambda: box.append(demo_core.run_comparison(config)))
    worker.start()
    worker.join()
    document = box.pop().to_dict()
    assert document["config"]["seed"] == index
    plot = gr.Plot()
    for draw in (plots.throughput_figure, plots.loss_figure, plots.memory_figure):
        figure = draw(document)
        made.append(weakref.ref(figure))
        assert plot.postprocess(figure).plot.startswith("data:image/webp")
    return made


@pytest.fixture
def models_built(monkeypatch):
    """Weak references to every model a run builds (the real build; only observed)."""
    built, real_build = [], ModelSource.build

    def build(self, *args, **kwargs):
        model = real_build(self, *args, **kwargs)
        built.append(weakref.ref(model))
        return model

    monkeypatch.setattr(ModelSource, "build", build)
    return built


def test_no_model_trainer_or_figure_survives_a_run(models_built):
    figures = run_like_the_app(0)
    gc.collect()
    assert len(models_built) >= 3  # one per collator, and the contamination check's
    assert [ref for ref in models_built if ref() is not None] == []
    assert [ref for ref in figures if ref() is not None] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_a_finished_run_hands_its_freed_memory_back():
    trim = ctypes.CDLL(None).malloc_trim
    process = psutil.Process()
    run_like_the_app(1)  # warm-up: the first run loads code and fills caches for good
    for index in (2, 3):
        run_like_the_app(index)
        gc.collect()
        held = process.memory_info().rss
        trim(0)  # whatever this still releases, the run had kept after it finished
        released = held - process.memory_info().rss
        assert released < 20 * 2**20, f"run {index} kept {released / 2**20:.0f} MiB of freed heap"


def test_resident_memory_stays_flat_over_runs():
    process, rss = psutil.Process(), []
    for index in range(6):
        run_like_the_app(10 + index)
        gc.collect()
        rss.append(process.memory_info().rss)
    growth = max(rss[2:]) / rss[1] - 1
    print(f"\nsoak: RSS after runs 1-6 {[round(value / 2**20) for value in rss]} MiB; "
          f"growth after run 2 {growth:+.1%}")
    assert growth <= 0.10, [round(value / 2**20) for value in rss]
