"""The Space path end to end: `python app.py` as a user starts it, one /compare call through gradio_client.

Starts the app on a free port (offline, a temporary data folder), waits until it answers, asks for a short burst of
MODEL (default llama-1b on a GPU: the preset a GPU Space would offer), checks the document that comes back (every
collator trained, packing's losses match padding's, the device it ran on) and stops the app. Exit 1 on any failure.

    python benchmarks/app_check.py [--model llama-1b] [--out DIR]    # writes DIR/app_compare.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 120
# bf16 on a GPU: see gpu_report.py's LOSS_TOLERANCE
LOSS_TOLERANCE = 2e-2
# The fewest steps whose timed ones (not the warm-up, not the profiled step) give a speedup (step_statistics.py)
STEPS = 5


@contextlib.contextmanager
def served_app(env: dict[str, str] | None = None, quiet: bool = False) -> Iterator[str]:
    """`python app.py` as a user starts it: on a free port, offline, its data dir a temporary folder, `env` on top
    (`quiet`: its standard output dropped); yields its URL once it answers, and stops it after the block."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    with tempfile.TemporaryDirectory(prefix="packing-lab-app-") as data_dir:
        app = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env={
            **os.environ, "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
            "PACKING_LAB_DATA_DIR": data_dir, **(env or {})}, stdout=subprocess.DEVNULL if quiet else None)
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                if app.poll() is not None:
                    raise SystemExit(f"app.py exited with {app.returncode} before answering")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"app.py did not answer at {url} within {READY_TIMEOUT_S} s")
                time.sleep(0.5)
            yield url
        finally:
            app.terminate()
            app.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    started = time.monotonic()
    with served_app() as url:
        print(f"app answered after {time.monotonic() - started:.0f} s")
        document = Client(url, verbose=False).predict(
            model=args.model, dataset="flan-like", samples=32, collators="padded,flatten", steps=STEPS, batch_size=8,
            attention="auto", seed=0, max_length=1024, api_name="/compare")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "app_compare.json").write_text(json.dumps(document, indent=1))
    config, flatten = document["config"], document["comparison"]["flatten"]
    print(f"/compare: {args.model} on {config['resolved_device']} ({config['resolved_attention']}, "
          f"{config['resolved_precision']}), flatten {flatten['speedup_vs_padded']:.2f}x of padded, "
          f"max |Δloss| {flatten['max_abs_loss_diff_vs_padded']:.1e}")
    problems = []
    if [result["collator"] for result in document["results"]] != ["padded", "flatten"]:
        problems.append("not every collator trained")
    if any(len(result["losses"]) != STEPS for result in document["results"]):
        problems.append(f"a burst stopped short of {STEPS} steps")
    if flatten["max_abs_loss_diff_vs_padded"] > LOSS_TOLERANCE:
        problems.append(f"packed losses left padded ones by {flatten['max_abs_loss_diff_vs_padded']:.1e}")
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
