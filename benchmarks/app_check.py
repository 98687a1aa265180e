"""The Space path end to end: `python app.py` as a user starts it, one /compare call through gradio_client.

Starts the app on a free port (offline, a temporary data folder), waits until it answers, asks for a short burst of
MODEL (default llama-1b on a GPU: the preset a GPU Space would offer), checks the document that comes back (every
collator trained, packing's losses match padding's, the device it ran on) and stops the app. Exit 1 on any failure.

    python benchmarks/app_check.py [--model llama-1b] [--out DIR]    # writes DIR/app_compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 120
# bf16 on a GPU: see gpu_report.py's LOSS_TOLERANCE
LOSS_TOLERANCE = 2e-2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _client(url: str, app: subprocess.Popen):
    from gradio_client import Client

    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if app.poll() is not None:
            raise SystemExit(f"app.py exited with {app.returncode} before answering")
        try:
            return Client(url, verbose=False)
        except Exception:  # not listening yet
            if time.monotonic() > deadline:
                raise SystemExit(f"app.py did not answer at {url} within {READY_TIMEOUT_S} s") from None
            time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="packing-lab-app-") as data_dir:
        env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
               "PACKING_LAB_DATA_DIR": data_dir}
        app = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env)
        try:
            started = time.monotonic()
            client = _client(f"http://127.0.0.1:{port}/", app)
            print(f"app answered after {time.monotonic() - started:.0f} s")
            document = client.predict(model=args.model, dataset="flan-like", samples=32, collators="padded,flatten",
                                      steps=4, batch_size=8, attention="auto", seed=0, max_length=1024,
                                      api_name="/compare")
        finally:
            app.terminate()
            app.wait(timeout=30)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "app_compare.json").write_text(json.dumps(document, indent=1))
    config, flatten = document["config"], document["comparison"]["flatten"]
    print(f"/compare: {args.model} on {config['resolved_device']} ({config['resolved_attention']}, "
          f"{config['resolved_precision']}), flatten {flatten['speedup_vs_padded']:.2f}x of padded, "
          f"max |Δloss| {flatten['max_abs_loss_diff_vs_padded']:.1e}")
    problems = []
    if [result["collator"] for result in document["results"]] != ["padded", "flatten"]:
        problems.append("not every collator trained")
    if any(len(result["losses"]) != 4 for result in document["results"]):
        problems.append("a burst stopped short of 4 steps")
    if flatten["max_abs_loss_diff_vs_padded"] > LOSS_TOLERANCE:
        problems.append(f"packed losses left padded ones by {flatten['max_abs_loss_diff_vs_padded']:.1e}")
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
