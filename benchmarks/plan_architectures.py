"""`plan` on real-size configs of the hybrid and mixture-of-experts architectures transformers builds: each config
class's defaults (its released model's shape, where the class has one) saved as a model folder, and asked what a
visitor asks, in a fresh process with a time limit: seconds, exit status, and each collator's predicted speedup, or
the one-line refusal. It found the crashes, the 10-minute probes and the 16 GB operation count that docs/RESULTS.md
lists ("Real-size hybrid and MoE configs through `plan`").

    python benchmarks/plan_architectures.py [--configs BambaConfig NemotronHConfig] [--timeout 300] [--setting fsdp]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = ["BambaConfig", "BailingHybridConfig", "DeepseekV3Config", "FalconH1Config", "GptOssConfig",
           "GraniteMoeHybridConfig", "GraniteMoeSharedConfig", "JambaConfig", "Lfm2Config", "Mamba2Config",
           "MiniMaxConfig", "MixtralConfig", "NemotronHConfig", "OlmoHybridConfig", "OlmoeConfig", "Qwen3Config",
           "Qwen3MoeConfig", "Qwen3NextConfig", "Qwen3_5MoeConfig", "Zamba2Config"]
# DeepSeek-V2-Lite's shape (its config.json); DeepseekV2Config's defaults leave the experts per token unset.
SHAPES = {"DeepSeek-V2-Lite": ("DeepseekV2Config", dict(
    hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64, num_experts_per_tok=6,
    moe_intermediate_size=1408, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, n_shared_experts=2, first_k_dense_replace=1, intermediate_size=10944, num_hidden_layers=27,
    vocab_size=102400, n_group=1, topk_group=1))}
SETTINGS = {"fsdp": ["--gpus", "8", "--shard", "fsdp", "--gradient-checkpointing"],
            "qlora": ["--qlora", "--lora-rank", "16", "--gpus", "1"],
            "lora-ddp": ["--lora-rank", "16", "--gpus", "2", "--shard", "none"]}
COMMON = ["--gpu-type", "h100-sxm", "--seq-length", "4096", "--batch-size", "4", "--precision", "bf16"]


def _lengths(path: Path) -> None:
    """3,000 lognormal token lengths (median 245), the profile every plan prices."""
    generator = random.Random(0)
    path.write_text("".join(f"{int(generator.lognormvariate(5.5, 0.9)) + 1}\n" for _ in range(3000)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=CONFIGS + list(SHAPES))
    parser.add_argument("--setting", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--timeout", type=int, default=300, help="seconds each plan may take")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder, lengths, answer = Path(scratch) / "model", Path(scratch) / "lengths.txt", Path(scratch) / "plan.json"
        _lengths(lengths)
        print("| config | setting | exit | seconds | flatten speedup, or the refusal |\n|---|---|---|---|---|")
        for name in args.configs:
            class_name, fields = SHAPES.get(name, (name, {}))
            getattr(transformers, class_name)(**fields).save_pretrained(folder)
            for setting in args.setting:
                answer.unlink(missing_ok=True)
                command = [sys.executable, "-m", "demo_core", "plan", "--model", str(folder), "--dataset",
                           str(lengths), *COMMON, *SETTINGS[setting], "--json", str(answer)]
                start = time.perf_counter()
                try:
                    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
                    status, stderr = done.returncode, done.stderr
                except subprocess.TimeoutExpired:
                    status, stderr = "timeout", ""
                seconds = time.perf_counter() - start
                if status == 0:
                    collators = json.loads(answer.read_text())["throughput"]["collators"]
                    said = f"{collators['flatten']['speedup_vs_padded']:.2f}x"
                else:
                    said = next((line for line in stderr.splitlines() if line.startswith(("error:", "Traceback"))),
                                stderr.strip().splitlines()[-1] if stderr.strip() else "")[:160]
                print(f"| {name} | {setting} | {status} | {seconds:.0f} | {said} |", flush=True)


if __name__ == "__main__":
    main()
