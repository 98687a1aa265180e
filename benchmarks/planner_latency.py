"""How long the planner's common LoRA / QLoRA questions take: cold (the first question in a fresh process) and after
the server's start-up warm-up (serving/planner_page.py `warm_up_in_background`); and what that warm-up costs, in
seconds and CPU seconds, with PACKING_LAB_PLANNER_WARMUP=all (the default) and =opening.

Each question is "will LoRA r16 (or QLoRA r16) of this model fit 24 GB at 4 x 2048 tokens?", asked two ways: as
`/plan` and the CLI ask it (`demo_core.plan`, equal lengths), and as the page asks it (`plan_page`: its opening
settings with those changes, both layouts and the three figures). Cold: one fresh process per question, the seconds
of the first call after the imports. Warm: one process that runs the "all" warm-up to its end, then asks every
question. The warm-up's CPU seconds are the process's (getrusage) while its thread runs and the main thread waits;
"opening" is measured in a fresh process of its own.

    python benchmarks/planner_latency.py [--models Llama-3.1-8B Qwen2.5-7B Mistral-7B-v0.3] [--warm-only]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere in the checkout

QUESTION = dict(lora_rank=16, batch_size=4, seq_length=2048, gpu_gb=24)  # the question (issue 30)
MODES = {"LoRA r16": dict(qlora=False), "QLoRA r16": dict(qlora=True)}


def ask(model: str, mode: str, way: str) -> float:
    """Seconds to answer one question in this process, `way` "plan" (demo_core.plan) or "page" (plan_page)."""
    from demo_core import PlanRequest, plan
    from serving import planner_page

    settings = {**QUESTION, **MODES[mode], "model": model}
    started = time.perf_counter()
    if way == "plan":
        plan(PlanRequest(**settings))
    else:
        planner_page.plan_page(**{**planner_page.PAGE_DEFAULTS, **settings})
    return time.perf_counter() - started


def in_a_fresh_process(call: str) -> list[float]:
    """The number or numbers `call` (a call of this module's, `bench.`) returns, in a fresh Python process (nothing
    imported or fitted yet)."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import benchmarks.planner_latency as bench; "
            f"value = {call}; print(*(value if isinstance(value, tuple) else (value,)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return [float(number) for number in done.stdout.strip().splitlines()[-1].split()]


def cold(model: str, mode: str, way: str) -> float:
    """The first question of a fresh process (its imports not counted)."""
    return in_a_fresh_process(f"bench.ask({model!r}, {mode!r}, {way!r})")[0]


def warm_up_cost(scope: str) -> tuple[float, float]:
    """(seconds, CPU seconds) of the start-up warm-up under `scope`, from a process with nothing fitted yet."""
    from serving import planner_page

    def cpu_s() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    started, started_cpu_s = time.perf_counter(), cpu_s()
    planner_page.warm_up_in_background(scope).join()
    return time.perf_counter() - started, cpu_s() - started_cpu_s


def opening_warm_up_cost() -> tuple[float, float]:
    """`warm_up_cost("opening")` in a fresh process (this one has fitted everything by then)."""
    wall_s, cpu_s = in_a_fresh_process("bench.warm_up_cost('opening')")
    return wall_s, cpu_s


def after_warm_up(models: list[str]) -> tuple[tuple[float, float], dict[tuple[str, str, str], float]]:
    """((seconds, CPU seconds) the "all" warm-up took, seconds per question after it) in one process."""
    from demo_core.memory import probe
    from serving import planner_page

    cost = warm_up_cost("all")
    questions = len(planner_page.opening_questions()) + len(planner_page.lora_questions())
    print(f"start-up warm-up (all): {cost[0]:.1f} s, {cost[1]:.1f} CPU s for {questions} questions, "
          f"{len(probe._FIT_CACHE)} probe fits cached (the cache keeps {probe._FIT_CACHE.max_entries})")
    return cost, {(model, mode, way): ask(model, mode, way)
                  for model in models for mode in MODES for way in ("plan", "page")}


def main() -> None:
    from demo_core import shipped_configs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["Llama-3.1-8B", "Qwen2.5-7B", "Mistral-7B-v0.3"])
    parser.add_argument("--warm-only", action="store_true", help="skip the cold questions (one process each)")
    arguments = parser.parse_args()
    models = [model for model in arguments.models if model in shipped_configs()]
    keys = [(model, mode, way) for model in models for mode in MODES for way in ("plan", "page")]
    cold_s = {key: math.nan if arguments.warm_only else cold(*key) for key in keys}
    opening_s, opening_cpu_s = opening_warm_up_cost()
    print(f"start-up warm-up (opening): {opening_s:.1f} s, {opening_cpu_s:.1f} CPU s")
    (warm_up_s, warm_up_cpu_s), warm_s = after_warm_up(models)
    print(f"{'model':<18}{'question':<11}{'way':<6}{'cold s':>8}{'after warm-up s':>17}")
    for key in cold_s:
        print(f"{key[0]:<18}{key[1]:<11}{key[2]:<6}{cold_s[key]:>8.2f}{warm_s[key]:>17.2f}")
    rounded = {key: None if math.isnan(seconds) else round(seconds, 2) for key, seconds in cold_s.items()}
    print(json.dumps({"warm_up": {"all": {"s": round(warm_up_s, 1), "cpu_s": round(warm_up_cpu_s, 1)},
                                  "opening": {"s": round(opening_s, 1), "cpu_s": round(opening_cpu_s, 1)}},
                      "questions": [{"model": m, "question": q, "way": w, "cold_s": rounded[m, q, w],
                                     "after_warm_up_s": round(warm_s[m, q, w], 2)} for m, q, w in cold_s]}))


if __name__ == "__main__":
    main()
