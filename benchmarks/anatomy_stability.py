"""Do two identical runs agree on the time anatomy while both cores are busy? The acceptance check of the anatomy.

Starts --busy-cores processes that each keep a CPU core busy (a Python spin loop, as `python -c "while True: pass"`
does), then runs the CLI's comparison --runs times with the same arguments (the CLI defaults unless given:
tiny-llama, flan-like, 256 samples, padded,flatten, 20 steps, so 5 profiled steps per collator), each in its own
process as a user would. Per collator it reports every run's share of the median profiled step by phase and by
operation class, the largest difference of a share between runs (the target: ±0.10, --tolerance), backward /
forward from the phases' CPU time (sane: inside anatomy.PLAUSIBLE_BACKWARD_OVER_FORWARD) beside the wall-clock one, and
the anatomy's doubts. Exits 1 when a share
differs by more than the tolerance or a ratio is not sane. Writes `anatomy_stability.md` and `.json` under --out.

    python benchmarks/anatomy_stability.py --out /tmp/anatomy
    python benchmarks/anatomy_stability.py --busy-cores 0 -- --model small-llama --steps 10
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.speedup_stability import _run_cli, busy_cores, stability_parser  # noqa: E402  (same runs, same load)
from demo_core.training.anatomy import PLAUSIBLE_BACKWARD_OVER_FORWARD, backward_over_forward  # noqa: E402


def shares(anatomy: dict) -> dict[str, float]:
    """Every phase's and operation class's share of the step, keyed "phase:forward", "op:matmul", ..."""
    return {f"{label}:{name}": seconds / anatomy["step_s"]
            for label, part in (("phase", "phases"), ("op", "ops")) for name, seconds in anatomy[part].items()}


def compare_runs(documents: list[dict], tolerance: float) -> tuple[list[dict], bool]:
    """Per collator: the shares of each run, the largest difference between runs, backward / forward, doubts."""
    low, high = PLAUSIBLE_BACKWARD_OVER_FORWARD
    rows, agree = [], True
    for index, result in enumerate(documents[0]["results"]):
        anatomies = [document["results"][index]["time_anatomy"] for document in documents]
        per_run = [shares(anatomy) for anatomy in anatomies]
        differences = {key: max(run[key] for run in per_run) - min(run[key] for run in per_run) for key in per_run[0]}
        worst = max(differences, key=differences.get)
        ratios = [backward_over_forward(anatomy) for anatomy in anatomies]
        wall_ratios = [backward_over_forward(anatomy, "phases_wall") for anatomy in anatomies]
        sane = all(ratio is not None and low <= ratio <= high for ratio in ratios)
        agree = agree and differences[worst] <= tolerance and sane
        rows.append({"collator": result["collator"], "profiled_steps": result["profiled_steps"], "shares": per_run,
                     "largest_difference": differences[worst], "largest_difference_of": worst,
                     "backward_over_forward": ratios, "backward_over_forward_wall": wall_ratios, "sane": sane,
                     "doubts": [anatomy.get("doubts", []) for anatomy in anatomies]})
    return rows, agree


def markdown(rows: list[dict], tolerance: float, agree: bool) -> str:
    keys = list(rows[0]["shares"][0])
    lines = ["| collator | run | " + " | ".join(keys) + " | backward / forward (CPU time) | (wall clock) | doubts |",
             "|---|---|" + "---|" * (len(keys) + 3)]
    for row in rows:
        for run, (run_shares, ratio, wall, doubts) in enumerate(zip(
                row["shares"], row["backward_over_forward"], row["backward_over_forward_wall"], row["doubts"])):
            wall_text = "–" if wall is None else f"{wall:.2f}"
            lines.append(f"| {row['collator']} | {run + 1} | " + " | ".join(f"{run_shares[k]:.2f}" for k in keys)
                         + f" | {ratio:.2f} | {wall_text} | {'; '.join(doubts) or '–'} |")
        lines.append(f"| {row['collator']} | largest difference | {row['largest_difference']:.3f} "
                     f"({row['largest_difference_of']}) |" + " |" * (len(keys) + 2))
    verdict = f"every share within ±{tolerance:.2f} between runs and every backward / forward sane: " \
              f"{'yes' if agree else 'NO'}"
    return "\n".join(lines) + f"\n\n{verdict}\n"


def main(argv=None) -> int:
    args = stability_parser(__doc__, 2, 0.10, "allowed difference of a share between runs",
                            "runs/anatomy_stability").parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    with busy_cores(args.busy_cores):
        documents = [_run_cli(args.cli_args, out / f"run-{run + 1}.json") for run in range(args.runs)]
    rows, agree = compare_runs(documents, args.tolerance)
    table = markdown(rows, args.tolerance, agree)
    (out / "anatomy_stability.md").write_text(table)
    (out / "anatomy_stability.json").write_text(json.dumps(
        {"rows": rows, "agree": agree, "busy_cores": args.busy_cores, "cli_args": args.cli_args,
         "wall_s": [document["wall_s"] for document in documents], "load_average_before": load_before,
         "load_average_after": os.getloadavg(), "cpu_count": os.cpu_count(),
         "date": time.strftime("%Y-%m-%d %H:%M %Z")}, indent=2))
    print(table)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
