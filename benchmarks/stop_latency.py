"""How long Stop takes to end a run, and how many steps still ran after it: every collator, the default model.

Starts `run_comparison` with all seven collators, sets the stop event once the collators have taken `--after`
steps between them (21: mid-run, every model built and training; 2: while the third collator builds its model and
the later ones have none yet), and reports the seconds from the stop to the run's return and the steps that ended
after the stop.

    python benchmarks/stop_latency.py [--model tiny-llama] [--after 21] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere in the checkout

from demo_core import RunConfig, run_comparison  # noqa: E402
from demo_core.collators import collator_names  # noqa: E402


def one_stop(model: str, after: int) -> tuple[float, int, int]:
    """(seconds from the stop to the return, steps ended after the stop, collators in the partial result)."""
    stop = threading.Event()
    steps_done: dict[str, int] = {}
    stopped_at: list[float] = []
    steps_after_stop = 0

    def progress(collator: str, step: int, total: int) -> None:
        nonlocal steps_after_stop
        steps_done[collator] = step
        if stop.is_set():
            steps_after_stop += 1
        elif sum(steps_done.values()) >= after:
            stopped_at.append(time.perf_counter())
            stop.set()

    config = RunConfig(model=model, collators=collator_names(), steps=100)
    comparison = run_comparison(config, progress=progress, stop_event=stop)
    return time.perf_counter() - stopped_at[0], steps_after_stop, len(comparison.results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--after", type=int, default=21, help="steps the collators take between them before the stop")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    latencies = []
    for attempt in range(args.repeat):
        seconds, late_steps, results = one_stop(args.model, args.after)
        latencies.append(seconds)
        print(f"run {attempt + 1}: stop -> return {seconds:.2f} s, {late_steps} steps ended after the stop, "
              f"{results} partial results")
    print(f"median stop latency {statistics.median(latencies):.2f} s over {args.repeat} runs "
          f"({len(collator_names())} collators, {args.model})")


if __name__ == "__main__":
    main()
