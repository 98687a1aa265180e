"""The published padded-vs-packed GPU measurements benchmarks/throughput_published.py predicts: each source's
setting as stated (what it leaves unstated is named in `assumed`), its measured speedup and, where given, real
tokens per second per GPU, and the length profile of its data. Data only: the script prices and reports them.
"""

from __future__ import annotations

import dataclasses
import random
import statistics

import numpy as np
from transformers import BambaConfig, GraniteMoeConfig, LlamaConfig

FMS_CSV = ("https://github.com/foundation-model-stack/fms-acceleration/blob/876e2ed/scripts/benchmarks/refs_orca/"
           "a100_80gb_pf.csv")
FMS_MOE_CSV = ("https://github.com/foundation-model-stack/fms-acceleration/blob/876e2ed/scripts/benchmarks/refs/"
               "a100_80gb_moe.csv")
FMS_PR_66 = "https://github.com/foundation-model-stack/fms-acceleration/pull/66 (description, Subset of Flan)"
PAPER = "https://arxiv.org/abs/2407.09105 (v6, Table 2)"
PR_31629 = "https://github.com/huggingface/transformers/pull/31629 (description, Example Result 1)"
PR_35861 = "https://github.com/huggingface/transformers/pull/35861 (description: Bamba padding-free, Tulu v3)"
OPEN_INSTRUCT_740 = "https://github.com/allenai/open-instruct/pull/740 (comment of 2025-07-03)"


def shifted_lognormal(count: int, mean: float, sigma: float, shift: float, cap: int) -> list[int]:
    """`count` lengths at evenly spaced quantiles of shift + lognormal(sigma), scaled to `mean` (deterministic)."""
    unit = statistics.NormalDist()
    base = np.exp(sigma * np.array([unit.inv_cdf((index + 0.5) / count) for index in range(count)]))
    lengths = shift + (mean - shift) * base / base.mean()
    return [int(min(cap, max(1, round(length)))) for length in lengths]


def _padded_over_real(lengths: list[int], batch: int) -> float:
    """Padded slots per real token of consecutive batches of a shuffled profile."""
    shuffled = list(lengths)
    random.Random(0).shuffle(shuffled)
    batches = [shuffled[start:start + batch] for start in range(0, len(shuffled) - batch + 1, batch)]
    return sum(len(b) * max(b) for b in batches) / sum(sum(b) for b in batches)


def fitted_lognormal(count: int, mean: float, shift: float, cap: int, batch: int, padded_over_real: float) -> list[int]:
    """The shifted lognormal whose padded slots per real token at `batch` are the source's (bisection on sigma)."""
    low, high = 0.01, 2.0
    for _ in range(30):
        sigma = (low + high) / 2
        if _padded_over_real(shifted_lognormal(count, mean, sigma, shift, cap), batch) < padded_over_real:
            low = sigma
        else:
            high = sigma
    return shifted_lognormal(count, mean, (low + high) / 2, shift, cap)


# Length profiles, in the model's tokens. Each is approximated by a distribution matching what the source states or
# what its own numbers imply; none is the real dataset.
PROFILES = {
    # OrcaMath, 8,000 examples, fms-acceleration's chat template, Mistral tokenizer. The CSV gives real tokens per
    # example (padding-free rows: 289.3) and padded slots per example at per-GPU batch 2, 4 and 8 (padded rows'
    # train_tokens_per_second x GPUs / samples per second: 368.8, 445.2, 524.2). A lognormal shifted by 20 tokens with
    # sigma 0.50 matches them within 2.1% (E[max of 2, 4, 8] = 361, 444, 531).
    "orcamath-8k (fms)": shifted_lognormal(8000, 289.3, 0.50, 20, 4096),
    # OrcaMath, 20,000 examples (the blog's subset size, assumed for the PR): the PR's tokens/s x seconds x 8 GPUs /
    # 20,000 = 401 (Llama-2) and 395 (Mistral) tokens per example. The same problems in a longer prompt format: the
    # fms shape shifted by the 111 extra tokens (a template adds a constant to every example; it does not stretch
    # the spread).
    "orcamath-20k": shifted_lognormal(20000, 400.0, 0.50, 20 + 111, 4096),
    # FLAN, 20,000 examples: offline packing filled 585 rows of 4,096 (Table 2), so about 585 x 4096 / 20,000 = 120
    # tokens per example. The spread is not stated: the shape of this repo's flan-like generator (lognormal, sigma
    # 0.85, demo_core/data/loading.py), cut at the runs' max length 4,096.
    "flan-20k": shifted_lognormal(20000, 119.8, 0.85, 0, 4096),
    # fms-acceleration's FLAN subset (PR #66's benchmark; PR #67 names it "Flan Subset (6000 samples)", an internal
    # preparation): 6,000 examples, and #66's own table gives 484 real tokens each (padding-free tokens/s per device x
    # runtime x 2 devices / 6,000: 1875 x 774, 1142 x 1271 and 1156 x 1255 all give 2.90M tokens). Four times the
    # paper's FLAN examples: another sampling and template. The spread is not stated: the paper's FLAN shape above.
    "flan-6k (fms)": shifted_lognormal(6000, 484.0, 0.85, 0, 4096),
    # Alpaca (fms-acceleration's default benchmark data, instruct-formatted), granite tokenizer. The MoE CSV gives real
    # tokens per example (padding-free rows: 5741.041 tokens/s / 29.631 samples/s = 193.7) and padded slots per
    # example at per-GPU batch 8 (padded rows: 5440.927 / 19.502 = 279.0, the same at 2 and 4 GPUs). The instruct
    # template adds about 40 tokens to every example (a shift); sigma is fitted to 279.0 / 193.7.
    "alpaca (fms moe)": fitted_lognormal(20000, 193.7, 40, 4096, 8, 279.0 / 193.7),
    # Tulu v3 SFT mixture: 939,343 examples in 2,914,250,826 bytes of messages (its dataset card), about 3,100 bytes
    # or 775 tokens (4 bytes a token) each; the spread is not stated: lognormal sigma 1.0 (chat data spans short
    # prompts to long code and math answers), cut at open-instruct's max length 4,096.
    "tulu-3": shifted_lognormal(20000, 775.0, 1.0, 0, 4096),
}


def granite_8b_code() -> LlamaConfig:
    """ibm-granite/granite-8b-code-base, a Llama architecture (its config.json: 36 layers, hidden 4096, 32 heads, 8
    KV heads, MLP 14336, vocabulary 49152); not a shipped config."""
    return LlamaConfig(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                       intermediate_size=14336, vocab_size=49152, tie_word_embeddings=False)


def granite_3b_a800m() -> GraniteMoeConfig:
    """ibm-granite/granite-3.0-3b-a800m-instruct, a mixture of experts: 40 experts of width 512, 8 per token, hidden
    1536 (vLLM's benchmarks/kernels/benchmark_shapes.py: [40, 8, 1024, 1536]); 32 layers, 24 heads, 8 KV heads,
    vocabulary 49155, tied embeddings (its config.json)."""
    return GraniteMoeConfig(hidden_size=1536, intermediate_size=512, num_local_experts=40, num_experts_per_tok=8,
                            num_hidden_layers=32, num_attention_heads=24, num_key_value_heads=8, vocab_size=49155,
                            tie_word_embeddings=True)


def bamba_9b() -> BambaConfig:
    """ibm-ai-platform/Bamba-9B, a Mamba2 / attention hybrid: 32 layers, attention in layers 9, 18 and 27, state 128
    (its config.json); the rest is transformers' BambaConfig default, which is Bamba-9B's (hidden 4096, MLP 14336, 32
    heads, 8 KV heads, 128 Mamba heads of 64, chunk 256), with the Llama-3 vocabulary of 128,256."""
    return BambaConfig(attn_layer_indices=[9, 18, 27], mamba_d_state=128, vocab_size=128256)


CONFIGS = {"granite-8b-code": granite_8b_code, "granite-3.0-3b-a800m": granite_3b_a800m, "bamba-9b": bamba_9b}


@dataclasses.dataclass(frozen=True)
class PublishedRow:
    source: str
    setting: str  # as stated
    assumed: str  # what the source leaves unstated and the row takes
    model: str  # a shipped config's name, or a key of CONFIGS
    profile: str
    run: dict  # predict_throughput keyword arguments
    collator: str  # the packed collator measured against padding
    measured_speedup: float
    padded_tokens_per_s: float | None  # real tokens per second per GPU
    packed_tokens_per_s: float | None
    calibrate: bool = False


# Every published run here used transformers' Trainer of 2024-2025, whose default optimizer was adamw_torch: torch's
# AdamW picks its multi-tensor (foreach) implementation on CUDA.
_FMS_BASE = dict(gpu="a100-80gb", precision="fp16", weights="half", gradient_checkpointing=True, grad_accum=2,
                 max_length=4096, optimizer_impl="foreach")
_FMS_QLORA = dict(lora_rank=16, qlora=True, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
_FMS_ASSUMED = "A100-80GB SXM (the file's name); 1 GPU: no sharding traffic"
# (framework pair, per-GPU batch, GPUs): samples/s padded, samples/s padding-free, tokens/s padding-free (per GPU)
_FMS = {
    ("full", 4, 1): (5.405, 7.038, 2035.906), ("full", 2, 2): (6.244, 6.785, 987.156),
    ("full", 8, 1): (5.596, 9.061, 2620.86), ("full", 4, 2): (8.65, 11.227, 1610.12),
    ("bnb", 4, 1): (5.678, 6.276, 1815.504), ("bnb", 2, 2): (2.56, 2.69, 391.287),
    ("bnb", 8, 1): (6.289, 9.515, 2752.385), ("bnb", 4, 2): (5.132, 5.283, 757.607),
    ("gptq", 4, 1): (6.357, 7.18, 2084.464), ("gptq", 2, 2): (2.588, 2.653, 387.358),
    ("gptq", 8, 1): (6.566, 10.38, 3013.188), ("gptq", 4, 2): (5.196, 5.386, 775.241),
}
# One row per kind of run calibrates: each parameter is fitted on the first row that exercises it. The 2-GPU
# bitsandbytes row at batch 4 fits `sharded_dequant_efficiency`: without fused kernels, a 4-bit base sharded by FSDP
# costs about 1.3-1.5 s per micro-batch whatever its tokens (2.56 and 5.13 samples/s at batch 2 and 4: the same 1.56 s
# per micro-batch), under half the rate of the same file's fused-kernel (foak) rows; GPTQ's rows, batch 2 and fms
# #66's FLAN rows test it.
_FMS_CALIBRATE = {("full", 4, 1), ("full", 4, 2), ("bnb", 4, 1), ("gptq", 8, 1), ("bnb", 4, 2)}
_FMS_NAMES = {"full": "full fine-tune (none vs aadp-padding-free)",
              "bnb": "QLoRA bitsandbytes r16 qkvo (accelerated-peft-bnb vs -padding-free)",
              "gptq": "GPTQ-LoRA r16 qkvo (accelerated-peft-autogptq vs -padding-free)"}


def _fms_rows() -> list[PublishedRow]:
    rows = []
    for (kind, batch, gpus), (padded_sps, free_sps, free_tps) in _FMS.items():
        run = {**_FMS_BASE, "batch_size": batch, "gpus": gpus, "shard": "fsdp" if gpus > 1 else "none",
               **(_FMS_QLORA if kind != "full" else {})}
        rows.append(PublishedRow(
            FMS_CSV, f"Mistral-7B-v0.1 {_FMS_NAMES[kind]}, {gpus}x A100-80GB{' FSDP' if gpus > 1 else ''}, "
                     f"per-GPU batch {batch}, "
                     "grad accum 2, fp16 weights, gradient checkpointing, FA2, OrcaMath train[:8000]",
            _FMS_ASSUMED + ("; GPTQ's 4-bit base priced as QLoRA's" if kind == "gptq" else ""),
            "Mistral-7B-v0.3", "orcamath-8k (fms)", run, "flatten", free_sps / padded_sps,
            padded_sps * 289.3 / gpus, free_tps, (kind, batch, gpus) in _FMS_CALIBRATE))
    return rows


_FMS_FLAN_RUN = {**_FMS_BASE, "batch_size": 4, "gpus": 2, "shard": "fsdp"}
_FMS_FLAN_ASSUMED = ("6,000 examples (PR #67), the spread of the paper's FLAN (same group, same data source); the fms "
                     "benchmark defaults of the CSV rows (A100-80GB, fp16 weights, checkpointing, grad accum 2)")
_PAPER_RUN = dict(gpu="a100-80gb", gpus=8, shard="fsdp", batch_size=4, grad_accum=2, max_length=4096,
                  precision="bf16", weights="half", gradient_checkpointing=True, optimizer_impl="foreach")
_PAPER_ASSUMED = ("not stated, so the same group's fms-hf-tuning benchmark defaults (the fms rows): gradient "
                  "checkpointing, half-precision (bf16) weights")
# fms's MoE benchmark: scenarios-moe.yaml (torch_dtype bfloat16, per-device batch 8, no grad accum set: the CSV's 16
# at 1 GPU), defaults.yaml (gradient checkpointing, FA2), ScatterMoE kernels (grouped GEMMs) in both runs.
_MOE_RUN = dict(gpu="a100-80gb", gpus=1, batch_size=8, grad_accum=16, max_length=4096, precision="bf16",
                weights="half", gradient_checkpointing=True, optimizer_impl="foreach")
# open-instruct's finetune.py: DeepSpeed ZeRO-3 (its stage-3 config), bf16, gradient checkpointing, max length 4,096.
_TULU_RUN = dict(gpu="a100-80gb", shard="zero3", max_length=4096, precision="bf16", weights="half",
                 gradient_checkpointing=True, optimizer_impl="foreach")
_TULU_ASSUMED = ("A100-80GB; open-instruct's defaults of the time (DeepSpeed ZeRO-3, checkpointing, max length 4,096); "
                 "tokens/s read off the PR's plots; past 8 GPUs one 200 Gb/s port per GPU (gpus.py)")

ROWS: list[PublishedRow] = _fms_rows() + [
    PublishedRow(PAPER, "Mistral-7B, FLAN 20k, 8x A100-80GB FSDP, batch 4, accum 2, max 4096: padding vs online "
                        "minibatch packing with position IDs", _PAPER_ASSUMED, "Mistral-7B-v0.3", "flan-20k",
                 _PAPER_RUN, "flatten", 1408 / 742, 742, 1408, calibrate=True),
    PublishedRow(PAPER, "Llama-2-7B, same setting", _PAPER_ASSUMED, "Llama-2-7b-hf", "flan-20k", _PAPER_RUN,
                 "flatten", 1455 / 771, 771, 1455),
    PublishedRow(PAPER, "Granite-8B-code, same setting", _PAPER_ASSUMED, "granite-8b-code", "flan-20k", _PAPER_RUN,
                 "flatten", 1358 / 693, 693, 1358),
    PublishedRow(PAPER, "Mistral-7B, same setting: padding vs offline packing with position IDs (585 rows of 4096)",
                 _PAPER_ASSUMED, "Mistral-7B-v0.3", "flan-20k", _PAPER_RUN, "bfd", 3010 / 742, 742, 3010),
    PublishedRow(PR_31629, "Llama2-7B, OrcaMath subset, FSDP 8 GPUs: Padding vs ThisPR (790 s vs 574 s)",
                 "A100-80GB, batch 4, accum 2, max 4096 (the paper's setting) and its assumptions; 20k examples",
                 "Llama-2-7b-hf", "orcamath-20k", _PAPER_RUN, "flatten", 1746 / 1269, 1269, 1746, calibrate=True),
    PublishedRow(PR_31629, "Mistral-7B, same (812 s vs 596 s)",
                 "A100-80GB, batch 4, accum 2, max 4096 (the paper's setting) and its assumptions; 20k examples",
                 "Mistral-7B-v0.3", "orcamath-20k", _PAPER_RUN, "flatten", 1658 / 1216, 1216, 1658),
    PublishedRow(FMS_PR_66, "Mistral-7B full fine-tune, 2 devices, device batch 4, Flan subset: runtime 1430 s "
                            "padded vs 774 s padding-free", _FMS_FLAN_ASSUMED, "Mistral-7B-v0.3", "flan-6k (fms)",
                 _FMS_FLAN_RUN, "flatten", 1430 / 774, 992, 1875),
    PublishedRow(FMS_PR_66, "Mistral-7B QLoRA (BNB), same: 1612 s vs 1271 s", _FMS_FLAN_ASSUMED, "Mistral-7B-v0.3",
                 "flan-6k (fms)", {**_FMS_FLAN_RUN, **_FMS_QLORA}, "flatten", 1612 / 1271, 880, 1142),
    PublishedRow(FMS_PR_66, "Mistral-7B GPTQ-LoRA, same: 1569 s vs 1255 s", _FMS_FLAN_ASSUMED + "; GPTQ priced as "
                 "QLoRA", "Mistral-7B-v0.3", "flan-6k (fms)", {**_FMS_FLAN_RUN, **_FMS_QLORA}, "flatten", 1569 / 1255,
                 904, 1156),
    PublishedRow(FMS_MOE_CSV, "granite-3.0-3b-a800m-instruct (MoE, 40 experts, 8 per token) full fine-tune, 1x "
                              "A100-80GB, ScatterMoE (moe-scattermoe-granite-ep1 vs -ep1-padding-free), batch 8, "
                              "grad accum 16, bf16 weights, alpaca", "A100-80GB SXM (the file's name)",
                 "granite-3.0-3b-a800m", "alpaca (fms moe)", _MOE_RUN, "flatten", 29.631 / 19.502,
                 19.502 * 193.7, 5741.041, calibrate=True),
    PublishedRow(PR_35861, "Bamba-9B (Mamba2 hybrid), Tulu v3 SFT, open-instruct, 8 A100s, batch 4 per GPU: "
                           "600 -> 1200 tok/s/gpu", _TULU_ASSUMED + "; grad accum 4",
                 "bamba-9b", "tulu-3", {**_TULU_RUN, "gpus": 8, "batch_size": 4, "grad_accum": 4}, "flatten",
                 1200 / 600, 600, 1200),
    PublishedRow(PR_35861, "Bamba-9B, same, 32 A100s: 450 -> 750 tok/s/gpu", _TULU_ASSUMED + "; grad accum 1",
                 "bamba-9b", "tulu-3", {**_TULU_RUN, "gpus": 32, "batch_size": 4, "grad_accum": 1}, "flatten",
                 750 / 450, 450, 750),
    PublishedRow(OPEN_INSTRUCT_740, "Bamba-9B, Tulu v3, 8x A100, per_device_train_batch_size 2: padding-free "
                                    "throughput ~40% higher", _TULU_ASSUMED + "; grad accum 8",
                 "bamba-9b", "tulu-3", {**_TULU_RUN, "gpus": 8, "batch_size": 2, "grad_accum": 8}, "flatten",
                 1.40, None, None),
]

# Found, recorded, not predicted: the model lacks what they depend on.
NOT_MODELLED = [
    (FMS_CSV, "accelerated-peft-bnb-foak / -autogptq-foak vs their -padding-free (8 pairs, 1.02x-1.38x)",
     "fused LoRA / norm / RoPE / loss kernels (fms 'foak') the model does not price"),
    (FMS_MOE_CSV, "ScatterMoE with expert parallelism over 2 and 4 GPUs (ep2, ep4), padded vs padding-free, "
                  "1.26x-1.46x", "expert parallelism's all-to-all is not priced"),
    (FMS_MOE_CSV, "ibm-research/moe-7b-1b-active-shared-experts and ibm-granite/granite-4.0-tiny-preview (Mamba2 / "
                  "MoE hybrid), ep1: 1.43x and 1.18x", "their configs could not be read here (no hub access)"),
    ("https://github.com/unslothai/unsloth/pull/3672", "unsloth/llama-3-8b, per-GPU batch 8: 96 s padded vs 52 s "
     "padding-free (1.85x); qwen2.5-0.5b needs batch >= 16, llama-3-8b >= 4 to gain", "GPU and dataset not stated"),
    ("https://github.com/huggingface/trl/pull/3526", "Qwen2.5-0.5B, trl-lib/tldr 2,000 examples, FA2 bf16: packing "
     "(bfd) vs no packing (grad accum 6) 3.7x", "GPU and batch sizes not stated"),
    ("https://github.com/NovaSky-AI/SkyRL/pull/1734", "Qwen2.5-0.5B-Instruct, Tulu-3 SFT, Megatron DP=4, micro batch "
     "8 x 4096 padded vs 32,768-token packed micro-batches: step 1.93 s -> 0.70 s (2.75x)",
     "Megatron, not the HF Trainer; GPU not stated"),
    ("https://github.com/foundation-model-stack/fms-acceleration/issues/70", "Mistral-7B OrcaMath, 2 devices, batch "
     "4, another transformers version: full FT 1.31x, BNB 0.98x, GPTQ 1.00x", "the CSV's rows of the same setting"),
    ("https://github.com/foundation-model-stack/fms-acceleration/pull/63", "Mistral-7B, OrcaMath 20K subset, 8 "
     "devices, batch 4, accum 2: padded 818 s vs fms's own PaddingFree plugin of the time 621 s (1.32x; beside it "
     "the same table's transformers rows, PR #31629's 812 s vs 596 s)",
     "fms's plugin, not DataCollatorWithFlattening: the same run with another implementation, which the model does "
     "not tell apart"),
    ("https://github.com/modelscope/ms-swift/pull/2499", "batch flattening: up to 50% more throughput, ~25% less "
     "peak memory", "model, GPU and data not stated"),
]
