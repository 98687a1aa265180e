"""The run as code, over the whole matrix of issue 32: for every collator, loss on all / completion / assistant, LoRA
off and on, gradient accumulation 1 and 2, `compare --emit-code DIR` and then `python DIR/train_<collator>.py` in a
fresh process offline (HF_HUB_OFFLINE=1, Packing Lab not on its path); prints the largest per-step |Δloss| between
each script and its burst (docs/RESULTS.md, "The run as code"). tests/test_recipe_scripts.py runs four of the twelve
cases on every test run.

    python benchmarks/recipe_parity.py [--steps 3] [--cases all/0/1,completion/4/2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_recipe_scripts import ALL_CASES, compare_with_code, offline_env  # noqa: E402

from demo_core import COLLATORS  # noqa: E402


def literal_run(folder: Path, name: str) -> list[float]:
    """`python DIR/train_<name>.py` as a fine-tuner runs it; its last line of standard output."""
    done = subprocess.run([sys.executable, str(folder / f"train_{name}.py")], capture_output=True, text=True,
                          env=offline_env(), cwd=tempfile.gettempdir(), timeout=1800)
    if done.returncode:
        raise RuntimeError(f"train_{name}.py failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cases", help="loss/rank/accumulation,... (default: all twelve)")
    args = parser.parse_args()
    cases = ALL_CASES if not args.cases else [
        (loss, int(rank), int(accumulation)) for loss, rank, accumulation in
        (case.split("/") for case in args.cases.split(","))]
    names = list(COLLATORS)
    print(f"tiny-llama, CPU fp32, {args.steps} steps, largest per-step |Δloss| of `python train_<collator>.py` "
          "against its burst\n")
    print("| loss on | LoRA rank | accumulation | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    with tempfile.TemporaryDirectory() as scratch:
        for loss_on, rank, accumulation in cases:
            started = time.perf_counter()
            folder = Path(scratch) / f"{loss_on}-{rank}-{accumulation}"
            document = compare_with_code(folder, loss_on, rank, accumulation, names, steps=args.steps)
            cells = []
            for result in document["results"]:
                losses = literal_run(folder, result["collator"])
                assert len(losses) == len(result["losses"]), (result["collator"], losses, result["losses"])
                cells.append(f"{max(abs(a - b) for a, b in zip(losses, result['losses'])):.1e}")
            print(f"| {loss_on} | {rank} | {accumulation} | " + " | ".join(cells) + " |", flush=True)
            print(f"  ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
