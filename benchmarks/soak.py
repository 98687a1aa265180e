"""Soak: many runs back to back in one app process; does resident memory stay flat after the first run?

Runs go through the app, as a visitor's would:
  page  the page's Run handler (`app.run_page`: a worker thread, partial figures after each collator, the final
        figures, the JSON/CSV downloads, the history row), every output passed through its Gradio component's
        `postprocess` (figures encoded to webp and closed, tables, files), exactly what Gradio sends to the browser
  api   `/compare` through `gradio_client` against the app launched in this process (queue, SSE, JSON)
After each run: gc, then resident memory (psutil RSS) and the live matplotlib figures, transformers models and Trainers.
The growth is RSS after the last run over RSS after the first (the first run loads libraries and warms caches).
Writes `soak-<mode>.md` under --out and exits 1 if the growth is over --max-growth percent.

    python benchmarks/soak.py                      # 20 page runs (~3 min on 2 CPU cores)
    python benchmarks/soak.py --mode api --runs 20
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere in the checkout


def live_objects() -> dict[str, int]:
    """Objects a finished run should not leave behind."""
    import transformers
    from matplotlib.figure import Figure

    counts = {"figures": 0, "models": 0, "trainers": 0}
    with warnings.catch_warnings():  # isinstance on some lazy torch modules warns about deprecated attributes
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, Figure):
                counts["figures"] += 1
            elif isinstance(obj, transformers.PreTrainedModel):
                counts["models"] += 1
            elif isinstance(obj, transformers.Trainer):
                counts["trainers"] += 1
    return counts


def page_runner(app, arguments: argparse.Namespace):
    """One Run click: the page handler, each yield post-processed by its output components as Gradio does."""
    request = types.SimpleNamespace(session_hash="soak")

    def run(index: int) -> dict:
        updates = app.run_page(request, model=arguments.model, dataset=arguments.dataset,
                               samples=arguments.samples + index, collators=arguments.collators.split(","),
                               steps=arguments.steps, batch_size=arguments.batch_size, seed=index, max_length=1024)
        for values in updates:  # {component: value}, what each yield changes
            for component, value in values.items():
                if value is not None and not isinstance(value, dict):  # gr.skip() is an update dict: nothing sent
                    component.postprocess(value)
        return app.HISTORY.entries()[-1].document

    return run


def api_runner(app, arguments: argparse.Namespace):
    from gradio_client import Client

    app.launch(prevent_thread_lock=True, quiet=True)
    client = Client(app.demo.local_url, verbose=False)

    def run(index: int) -> dict:
        return client.predict(model=arguments.model, dataset=arguments.dataset, samples=arguments.samples + index,
                              collators=arguments.collators, steps=arguments.steps, batch_size=arguments.batch_size,
                              seed=index, api_name="/compare")

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("page", "api"), default="page")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--dataset", default="flan-like")
    parser.add_argument("--samples", type=int, default=64, help="run i uses samples + i (every run differs)")
    parser.add_argument("--collators", default="padded,flatten,bfd")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-growth", type=float, default=10.0, help="percent; exit 1 above it")
    parser.add_argument("--out", type=Path, default=Path("runs"))
    arguments = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["PACKING_LAB_DATA_DIR"] = tempfile.mkdtemp(prefix="packing-lab-soak-")  # a history of its own
    import app  # noqa: E402  (reads the environment above at import)

    run = (page_runner if arguments.mode == "page" else api_runner)(app, arguments)
    process = psutil.Process()
    rows = []
    for index in range(arguments.runs):
        started = time.perf_counter()
        document = run(index)
        seconds = time.perf_counter() - started
        assert document["config"]["seed"] == index, "a run came back with another run's config"
        gc.collect()
        rss = process.memory_info().rss
        rows.append((index + 1, seconds, rss, live_objects()))
        first = rows[0][2]
        print(f"run {index + 1:3d}  {seconds:6.2f} s  RSS {rss / 2**20:8.1f} MiB  ({(rss - first) / first:+.1%})  "
              f"{rows[-1][3]}", flush=True)

    first, last = rows[0][2], rows[-1][2]
    growth = 100.0 * (last - first) / first
    peak = max(rss for _, _, rss, _ in rows)
    lines = [
        f"# Soak: {arguments.runs} runs, mode {arguments.mode}",
        "",
        f"{arguments.model}, {arguments.dataset}, samples {arguments.samples}+i, collators {arguments.collators}, "
        f"{arguments.steps} steps, batch {arguments.batch_size}; torch threads {__import__('torch').get_num_threads()}",
        "",
        "| run | seconds | RSS MiB | vs run 1 | live figures | live models | live Trainers |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {n} | {s:.2f} | {rss / 2**20:.1f} | {(rss - first) / first:+.1%} | {live['figures']} | "
          f"{live['models']} | {live['trainers']} |" for n, s, rss, live in rows),
        "",
        f"RSS after run 1: {first / 2**20:.1f} MiB; after run {len(rows)}: {last / 2**20:.1f} MiB; "
        f"growth {growth:+.1f}% (target <= {arguments.max_growth:.0f}%); peak {peak / 2**20:.1f} MiB",
    ]
    arguments.out.mkdir(parents=True, exist_ok=True)
    report = arguments.out / f"soak-{arguments.mode}.md"
    report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-1:]), f"\nwrote {report}")
    if arguments.mode == "api":
        app.demo.close()
    return 0 if growth <= arguments.max_growth else 1


if __name__ == "__main__":
    sys.exit(main())
