"""Loss parity with loss masks, and gradient accumulation: the numbers behind the README's "Which tokens carry loss".

Trains tiny-llama on CPU on the public-format files of tests/test_sft.py (written to a temporary folder) with
completion-only and assistant-only loss, through padded, flatten and trl-padding-free (TRL's SFTTrainer, which masks
the records itself), and prints the largest per-step |Δloss| against padded; then the same data as one batch of 8
against 4 accumulated micro-batches of 2, per collator.

    python benchmarks/sft_parity.py [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_sft import (  # noqa: E402
    ALPACA,
    CONVERSATION_RECORDS,
    DOLLY,
    GSM8K,
    PROMPT_COMPLETION_RECORDS,
    TRL_PROMPT_COMPLETION,
)

from demo_core import RunConfig, run_comparison  # noqa: E402

COLLATORS = ("padded", "flatten", "trl-padding-free")
CASES = [
    ("Alpaca, Dolly, GSM8K, LLaMA-Factory alpaca (chat template)", PROMPT_COMPLETION_RECORDS, "completion"),
    ("TRL prompt/completion (as they are)", TRL_PROMPT_COMPLETION, "completion"),
    ("ShareGPT, tool calls, OpenAI chat, OASST trees", CONVERSATION_RECORDS, "assistant"),
]


def run(path: str, steps: int, **settings) -> dict:
    settings = {"batch_size": 8, **settings}
    config = RunConfig(model="tiny-llama", dataset=path, samples=64, steps=steps, max_length=512,
                       device="cpu", precision="fp32", collators=COLLATORS, **settings)
    return run_comparison(config).to_dict()


def max_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    steps = parser.parse_args().steps
    torch.set_num_threads(1)
    print(f"tiny-llama, CPU fp32, {steps} steps, batch 8, max |Δloss| per step against padded\n")
    print("| data | loss on | trained / real tokens | flatten | trl-padding-free |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for label, rows, loss_on in CASES:
            path = Path(folder) / "data.jsonl"
            path.write_text("\n".join(json.dumps(row) for row in rows * 8))
            results = run(str(path), steps, loss_on=loss_on)["results"]
            padded = results[0]
            cells = [f"{max_difference(padded['losses'], r['losses']):.1e}" for r in results[1:]]
            print(f"| {label} | {loss_on} | {padded['trained_tokens']:,} / {padded['real_tokens']:,} | "
                  f"{' | '.join(cells)} |")
        path = Path(folder) / "alpaca.jsonl"
        path.write_text("\n".join(json.dumps(row) for row in (ALPACA + DOLLY + GSM8K) * 8))
        whole, accumulated = (run(str(path), steps, batch_size=8 // n, grad_accum=n)["results"] for n in (1, 4))
        print("\n4 micro-batches of 2 against 1 batch of 8 (completion-only), max |Δloss| per step:")
        for one, four in zip(whole, accumulated):
            print(f"  {one['collator']}: {max_difference(one['losses'], four['losses']):.1e}")


if __name__ == "__main__":
    main()
