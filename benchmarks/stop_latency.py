"""How long Stop takes to end a run, and how many steps still ran after it: every collator, the default model.

In the engine (the default): starts `run_comparison` with all seven collators, sets the stop event once the
collators have taken `--after` steps between them (21: mid-run, every model built and training; 2: while the third
collator builds its model and the later ones have none yet), and reports the seconds from the stop to the run's
return and the steps that ended after the stop.

Through the page (`--page`): starts `python app.py` (its data dir a temporary folder), keeps every core busy with one
spinning process per core at the server's priority, and runs on the page as a browser does: the Run button's event
(`run_page`) and, once the progress bar shows the first step, the Stop button's (`request_stop`), called with
gradio_client over the same HTTP queue the browser uses. Reports the seconds from the Stop call to the end
of the run's stream (its last update: the partial results drawn), for 2 collators (the page's default pair) and 7.

    python benchmarks/stop_latency.py [--model tiny-llama] [--after 21] [--repeat 3]
    python benchmarks/stop_latency.py --page [--collators 2 7] [--repeat 5]

What freezing the server's start-up objects saves (`--collection`): imports `app` (its page built, as `python app.py`
has it), counts the objects the garbage collector tracks, and times the full collection that ends every run
(`demo_core.caches.release_memory`) before and after `demo_core.freeze_start_up_objects()`, every core busy.

    python benchmarks/stop_latency.py --collection [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere in the checkout

import demo_core  # noqa: E402
from benchmarks.app_check import served_app  # noqa: E402
from benchmarks.speedup_stability import busy_cores  # noqa: E402
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


PAGE_STEPS = 100  # per collator: no run ends on its own before its Stop, even on an idle machine


def page_stop(client, run_event: int, stop_event: int, inputs: list) -> float:
    """Seconds from the Stop call to the end of the run's stream; Stop once the progress bar counts a step."""
    run = client.submit(*inputs, fn_index=run_event)
    while not any(unit.index for unit in run.status().progress_data or []):  # the first burst's first step
        if run.done():
            raise RuntimeError(f"the run ended before its first step: {run.result()}")
        time.sleep(0.01)
    stopped = time.perf_counter()
    client.submit(fn_index=stop_event)
    run.result(timeout=600)
    return time.perf_counter() - stopped


def through_the_page(model: str, collator_counts: list[int], repeat: int) -> None:
    from gradio_client import Client

    # the planner's warm-up off: its LoRA phase waits for an idle server anyway, and its opening phase would only add
    # a thread that is not there a minute after start-up
    spinners = os.cpu_count() or 1
    with served_app({"PACKING_LAB_PLANNER_WARMUP": "off"}, quiet=True) as url, busy_cores(spinners):
        client = Client(url, verbose=False, download_files=False)
        events = {event["api_name"]: event for event in client.config["dependencies"]}
        run_event, stop_event = events["run_page"], events["request_stop"]
        for event in (run_event, stop_event):  # the page's own events (api_visibility private): the browser's calls
            client.endpoints[event["id"]].is_valid = True
        components = {component["id"]: component["props"] for component in client.config["components"]}
        for count in collator_counts:
            chosen = {"model": model, "collators": list(collator_names()[:count]), "steps": PAGE_STEPS}
            inputs = [chosen.get(components[id_].get("elem_id"), components[id_].get("value"))
                      for id_ in run_event["inputs"]]
            latencies = []
            for attempt in range(repeat):
                latencies.append(page_stop(client, run_event["id"], stop_event["id"], inputs))
                print(f"{count} collators, run {attempt + 1}: Stop -> end of the run's stream {latencies[-1]:.2f} s",
                      flush=True)
            print(f"{count} collators ({model}, {spinners} busy cores): median {statistics.median(latencies):.2f} s, "
                  f"max {max(latencies):.2f} s over {repeat} runs", flush=True)
        client.close()


def collection_s(repeat: int) -> None:
    """The seconds of a full collection in a server process, its start-up objects walked and then frozen."""
    os.environ.setdefault("PACKING_LAB_DATA_DIR", tempfile.mkdtemp(prefix="packing-lab-gc-"))
    import app  # noqa: F401  (the page built: what a server holds for its whole life)

    def timed() -> float:
        started = time.perf_counter()
        gc.collect()
        return time.perf_counter() - started

    spinners = os.cpu_count() or 1
    with busy_cores(spinners):
        tracked = len(gc.get_objects())
        walked = statistics.median(timed() for _ in range(repeat))
        demo_core.freeze_start_up_objects()
        frozen = statistics.median(timed() for _ in range(repeat))
    print(f"{tracked:,} objects tracked after start-up; a full collection ({spinners} busy cores, median of {repeat}): "
          f"{walked:.2f} s walking them, {1000 * frozen:.1f} ms once frozen")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--after", type=int, default=21, help="steps the collators take between them before the stop")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--page", action="store_true", help="through the page's Run and Stop, every core busy")
    parser.add_argument("--collators", type=int, nargs="+", default=[2, 7], help="--page: collators per run")
    parser.add_argument("--collection", action="store_true", help="a full collection's seconds, before and after "
                        "the start-up objects are frozen")
    args = parser.parse_args()
    if args.collection:
        collection_s(args.repeat)
        return
    if args.page:
        through_the_page(args.model, args.collators, args.repeat)
        return
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
