"""Do two identical runs agree on the speedup while the machine is busy? The acceptance check of robust throughput.

Starts one process that keeps a CPU core busy (a Python spin loop), then runs the CLI's comparison --runs times with
the same arguments (the CLI defaults unless given: tiny-llama, flan-like, 256 samples, padded,flatten, 20 steps),
each in its own process as a user would, and reports every run's speedup of --collator over padded, with its range
and flags. The target: every run within ±15% (--tolerance) of the median run. Exits 1 when a run is not. Writes
`speedup_stability.md` and `.json` under --out, with the load average before and after.

    python benchmarks/speedup_stability.py --out /tmp/stability
    python benchmarks/speedup_stability.py --busy-cores 0 --runs 3 -- --model small-llama
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_cores(count: int):
    """`count` processes that each keep a core busy while the block runs (a spin loop, as `python -c "while True:
    pass"`)."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()


def stability_parser(description: str, busy_cores_default: int, tolerance_default: float, tolerance_help: str,
                     out_default: str) -> argparse.ArgumentParser:
    """The arguments both stability checks take: runs, busy cores, tolerance, output folder, the CLI's arguments."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--busy-cores", type=int, default=busy_cores_default,
                        help="spinning processes started for the whole check")
    parser.add_argument("--tolerance", type=float, default=tolerance_default, help=tolerance_help)
    parser.add_argument("--out", default=out_default)
    parser.add_argument("cli_args", nargs="*", help="after --: arguments for `python -m demo_core compare`")
    return parser


def _run_cli(extra: list[str], json_path: Path) -> dict:
    command = [sys.executable, "-m", "demo_core", "compare", "--json", str(json_path), *extra]
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    document = json.loads(json_path.read_text())
    document["wall_s"] = time.perf_counter() - started
    return document


def main(argv=None) -> int:
    parser = stability_parser(__doc__, 1, 0.15, "allowed deviation from the median run", "runs/speedup_stability")
    parser.add_argument("--collator", default="flatten", help="whose speedup over padded is compared")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rows = []
    with busy_cores(args.busy_cores):
        for run in range(args.runs):
            document = _run_cli(args.cli_args, out / f"run-{run + 1}.json")
            entry = document["comparison"][args.collator]
            rows.append({"run": run + 1, "speedup": entry["speedup_vs_padded"],
                         "speedup_range": entry.get("speedup_range"), "ideal": entry["ideal_speedup"],
                         "work_ideal": entry.get("work_ideal_speedup"), "flags": entry.get("flags", []),
                         "wall_s": document["wall_s"], "load_1min": os.getloadavg()[0]})
            print(rows[-1], flush=True)
    speedups = [row["speedup"] for row in rows]
    middle = statistics.median(speedups)
    deviations = [speedup / middle - 1 for speedup in speedups]
    agree = max(abs(d) for d in deviations) <= args.tolerance
    lines = ["| run | speedup | range | ideal | work ideal | vs median run | flags | wall s | load 1 min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row, deviation in zip(rows, deviations):
        low_high = row["speedup_range"]
        shown_range = f"{low_high[0]:.2f}–{low_high[1]:.2f}x" if low_high else "–"
        work = f"{row['work_ideal']:.2f}x" if row["work_ideal"] else "–"
        lines.append(f"| {row['run']} | {row['speedup']:.2f}x | {shown_range} | {row['ideal']:.2f}x | {work} | "
                     f"{deviation:+.1%} | {', '.join(row['flags']) or '–'} | {row['wall_s']:.0f} | "
                     f"{row['load_1min']:.1f} |")
    verdict = (f"max / min = {max(speedups) / min(speedups):.3f}; every run within ±{args.tolerance:.0%} of the "
               f"median run: {'yes' if agree else 'NO'}")
    table = "\n".join(lines) + f"\n\n{verdict}\n"
    (out / "speedup_stability.md").write_text(table)
    (out / "speedup_stability.json").write_text(json.dumps(
        {"rows": rows, "agree": agree, "busy_cores": args.busy_cores, "cli_args": args.cli_args,
         "load_average_before": load_before, "load_average_after": os.getloadavg(), "cpu_count": os.cpu_count(),
         "date": time.strftime("%Y-%m-%d %H:%M %Z")}, indent=2))
    print(f"\n{table}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
