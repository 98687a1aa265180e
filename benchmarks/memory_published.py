"""The memory planner next to published measurements of real runs: the tables of docs/MEMORY.md.

    python benchmarks/memory_published.py    # every table, as docs/MEMORY.md carries them (minutes on 2 cores)

1. Measurements of real runs, each against the planner's prediction of the metric it reports: nvidia-smi against
   `device_used_bytes`, `max_memory_reserved` against `reserved_bytes`, `max_memory_allocated` (or torchtune's peak
   active) against `total_bytes`, and the longest sequence a card trained against `max_seq_length`. Every public
   measurement found whose source states the model, batch, length, precision and optimizer (or says what its
   defaults were); the settings a source leaves out are the planner's defaults and are named in the row.
2. The reserve model's own inputs (memory_reserve.py): published gaps between reserved and allocated memory of one
   run, FSDP's measured slack, and CUDA context sizes. These calibrate it, so they are not in table 1.
3. The seed example (the HF anatomy page's bert-large, category by category), transformers PR #31629's relative
   change, and Korthikanti et al.'s per-layer activations, as before.
Runs nothing on a GPU and trains nothing: every prediction is the planner's.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

from transformers import MistralConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo_core.memory import reserve as memory_reserve  # noqa: E402
from demo_core.memory.estimate import SEED_MEASURED_MB, bert_large_config, estimate_memory_detail, seed_example_estimate  # noqa: E402
from demo_core.memory.plan_request import GIB, PlanRequest, load_config  # noqa: E402
from demo_core.memory.planner import device_estimate, largest_fitting, plan  # noqa: E402
from demo_core.memory.step import StepShape, TrainingSettings  # noqa: E402
from demo_core.models.sources import max_positions  # noqa: E402

MIB = 2 ** 20
PR_31629_MB = {"padded": 22_305, "packed": 20_950}
HF_SINGLE_GPU = "https://huggingface.co/docs/transformers/v4.27.2/en/perf_train_gpu_one"
UNSLOTH_LLAMA_3_3 = "https://unsloth.ai/blog/llama3-3"
TORCHTUNE_README = "https://github.com/pytorch/torchtune/blob/1814feb17/README.md"


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """One published measurement and the plan of the same run."""

    source: str
    setting: str  # as the source states it (and, in brackets, what it leaves to the planner's defaults)
    metric: str  # nvidia-smi | max_memory_reserved | max_memory_allocated | max_seq_length
    measured: float  # bytes, or tokens for max_seq_length (0: out of memory at any length)
    request: dict  # PlanRequest fields (model may name "bert-large-seq-cls": written to a folder at run time)


# The HF guide "Efficient training on a single GPU" (transformers v4.16-v4.27 docs): bert-large-uncased with a
# 2-label classification head, 512 random tokens per example, Trainer on a Tesla V100 16GB (CUDA 11.2 driver),
# nvidia-smi's used memory after training ("GPU memory occupied", MiB). The page measured the bare context:
# 1,343 MiB. That Trainer ran transformers' own AdamW (a per-tensor loop), eager attention, torch 1.10's
# zero_grad(set_to_none=False) (gradients kept between steps) and reentrant checkpointing.
_HF_BASE = dict(model="bert-large-seq-cls", seq_length=512, precision="fp32", attention="eager",
                optimizer_impl="single-tensor", keep_gradients=True, context_gb=1343 / 1024, gpu_gb=16)
_HF_RUNS = (
    ("batch 4, fp32, AdamW", 14_949, dict(batch_size=4)),
    ("batch 1 x 4 accumulated", 8_681, dict(batch_size=1, grad_accum=4)),
    ("batch 1 x 4, gradient checkpointing", 6_775, dict(batch_size=1, grad_accum=4, gradient_checkpointing=True)),
    ("batch 4, fp16 autocast", 13_939, dict(batch_size=4, precision="fp16")),
    ("batch 1 x 4, checkpointing, fp16", 7_275, dict(batch_size=1, grad_accum=4, gradient_checkpointing=True,
                                                     precision="fp16")),
    ("batch 4, Adafactor", 12_295, dict(batch_size=4, optimizer="adafactor")),
    ("batch 1 x 4, checkpointing, fp16, Adafactor", 4_847, dict(batch_size=1, grad_accum=4,
                                                               gradient_checkpointing=True, precision="fp16",
                                                               optimizer="adafactor")),
    ("batch 4, 8-bit Adam (bitsandbytes)", 13_085, dict(batch_size=4, optimizer="adamw_8bit")),
    ("batch 1 x 4, checkpointing, fp16, 8-bit Adam", 5_363, dict(batch_size=1, grad_accum=4,
                                                                gradient_checkpointing=True, precision="fp16",
                                                                optimizer="adamw_8bit")),
)
# Unsloth's "Llama 3.3 + Llama 3.1 max context" tables, Hugging Face + FA2 column: Llama 3.1 8B Instruct and
# Llama 3.3 70B Instruct (on an A100 80GB), 4-bit QLoRA on every linear layer (q, k, v, o, gate, up, down), rank 32,
# batch size 1, every sequence padded to the length tried (December 2024). [Not stated, so the stack of the time:
# Hugging Face's loss over the full logits; TRL's SFTTrainer, which for a 4-bit model called peft's
# prepare_model_for_kbit_training: gradient checkpointing on and every parameter that is not 4-bit (embeddings,
# norms, LM head) upcast to fp32, the planner's QLoRA default; AdamW as the planner's default.] The table's six
# Llama-3.1-8B cards lie on one line, memory = 9.7 GB + 2.47 MB x tokens: its fixed part is the upcast model's
# (the planner's, fp32 non-4-bit weights: 10.5 GiB; bf16 ones: 7.6 GiB).
_UNSLOTH_BASE = dict(qlora=True, lora_rank=32, batch_size=1, attention="flash_attention_2", loss="full",
                     gradient_checkpointing=True)
# foundation-model-stack/fms-acceleration, scripts/benchmarks/refs_orca/a100_80gb_pf.csv (scenarios-orca.yaml,
# defaults.yaml, refs_orca/requirements.txt: torch 2.4, transformers 4.44, flash-attn 2.6.3): Mistral-7B-v0.1 on
# the first 2,000 OrcaMath examples, one A100 80GB, flash attention, gradient checkpointing, 2 micro-batches per
# step, Trainer's AdamW (adamw_torch: foreach); full fine-tune with torch_dtype float16 and no autocast (weights,
# gradients and AdamW states all fp16: pure half precision, which the planner's pure-bf16 counts byte for byte);
# QLoRA (bitsandbytes NF4) r=16 on q, k, v, o, fp16 autocast. mem_peak_torch_mem_alloc_in_bytes is
# max_memory_allocated, mem_torch_mem_alloc_in_bytes memory_allocated after training. [Not stated: the sequence
# lengths of the batches (OrcaMath in Mistral's tokenizer): 1,024 tokens a row; the full fine-tune's peak is the
# optimizer step's, which no length changes. QLoRA's other weights as loaded, fp16 (its memory after training says
# so: with the fp32 upcast it would read 0.5 GB more).]
FMS_ORCA_CSV = ("https://github.com/foundation-model-stack/fms-acceleration/blob/6028250f1ae1838b7b6cf80e4b28bd12ba43564d"
                "/scripts/benchmarks/refs_orca/a100_80gb_pf.csv")
MISTRAL_7B_V01 = "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json"
_FMS_FULL = dict(model="Mistral-7B-v0.1", precision="pure-bf16", optimizer_impl="foreach", grad_accum=2,
                 gradient_checkpointing=True, attention="flash_attention_2", seq_length=1024, gpu_gb=80)
_FMS_QLORA = dict(model="Mistral-7B-v0.1", precision="fp16", qlora=True, lora_rank=16,
                  lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), base_dtype="half", grad_accum=2,
                  gradient_checkpointing=True, attention="flash_attention_2", seq_length=1024, gpu_gb=80)
_FMS_RUNS = (
    ("full fine-tune fp16, batch 4, padded", "max_memory_allocated", 72_468_057_600, dict(batch_size=4)),
    ("full fine-tune fp16, batch 8, padded", "max_memory_allocated", 72_470_203_904, dict(batch_size=8)),
    ("full fine-tune fp16, batch 4, padding-free", "max_memory_allocated", 72_468_633_600,
     dict(batch_size=4, packed=True)),
    ("full fine-tune fp16, batch 8, padding-free", "max_memory_allocated", 72_462_073_344,
     dict(batch_size=8, packed=True)),
    ("full fine-tune fp16, batch 4, after training", "memory_allocated", 43_467_546_624, dict(batch_size=4)),
)
_FMS_QLORA_RUNS = (
    ("QLoRA r=16 q,k,v,o, batch 4, after training", "memory_allocated", 4_306_167_808, dict(batch_size=4)),
    ("QLoRA r=16 q,k,v,o, batch 8, after training", "memory_allocated", 4_306_213_888, dict(batch_size=8)),
)
_UNSLOTH_RUNS = (
    ("Llama-3.1-8B", 12, 932), ("Llama-3.1-8B", 16, 2_551), ("Llama-3.1-8B", 24, 5_789),
    ("Llama-3.1-8B", 40, 12_264), ("Llama-3.1-8B", 48, 15_502), ("Llama-3.1-8B", 80, 28_454),
    ("Llama-3.3-70B-Instruct", 48, 0), ("Llama-3.3-70B-Instruct", 80, 6_916),
)

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    *(PublishedRun(HF_SINGLE_GPU, f"bert-large-uncased classifier, 512 tokens, V100: {setting}", "nvidia-smi",
                   mib * MIB, {**_HF_BASE, **change}) for setting, mib, change in _HF_RUNS),
    *(PublishedRun(UNSLOTH_LLAMA_3_3, f"{model}, QLoRA r=32 all linear, batch 1, padded, HF + FA2, {gb} GB "
                   "[checkpointing, fp32 non-4-bit weights, AdamW]", "max_seq_length", tokens,
                   {**_UNSLOTH_BASE, "model": model, "gpu_gb": gb, "seq_length": 2048})
      for model, gb, tokens in _UNSLOTH_RUNS),
    *(PublishedRun(FMS_ORCA_CSV, f"Mistral-7B-v0.1, OrcaMath, 1 x A100 80GB, FA2, checkpointing, 2 micro-batches: "
                   f"{setting} [1,024 tokens a row]", metric, measured, {**_FMS_FULL, **change})
      for setting, metric, measured, change in _FMS_RUNS),
    *(PublishedRun(FMS_ORCA_CSV, f"Mistral-7B-v0.1, OrcaMath, 1 x A100 80GB, FA2, checkpointing, 2 micro-batches: "
                   f"{setting} [fp16 non-4-bit weights]", metric, measured, {**_FMS_QLORA, **change})
      for setting, metric, measured, change in _FMS_QLORA_RUNS),
    # torchtune README (Nov 2024), memory flags table: Llama 3.2 3B, full fine-tune, bf16, batch 2, max length 4096,
    # A100, full_finetune_single_device; row "+ Packed Dataset" (every row 4096 tokens): peak memory active 60.0 GiB.
    # Before compile, the chunked loss, checkpointing and the other flags; AdamW (torch's, foreach by default).
    # torchtune's own Llama code and flex attention, not transformers'.
    PublishedRun(TORCHTUNE_README, "Llama-3.2-3B, full fine-tune bf16, batch 2 x 4096 packed, A100, AdamW, no "
                 "checkpointing (torchtune's model code)", "max_memory_allocated", 60.0 * GIB,
                 dict(model="Llama-3.2-3B", batch_size=2, seq_length=4096, precision="pure-bf16",
                      attention="flash_attention_2", optimizer_impl="foreach", gpu_gb=80)),
)


def _bert_folder(root: Path) -> str:
    folder = root / "bert-large-seq-cls"
    if not folder.exists():
        bert_large_config().save_pretrained(folder)
    return str(folder)


def _mistral_v01_folder(root: Path) -> str:
    """Mistral-7B-v0.1's config.json (MISTRAL_7B_V01): the shipped Mistral-7B-v0.3 has a larger vocabulary."""
    folder = root / "Mistral-7B-v0.1"
    if not folder.exists():
        MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                      sliding_window=4096, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      architectures=["MistralForCausalLM"]).save_pretrained(folder)
    return str(folder)


_LOCAL_MODELS = {"bert-large-seq-cls": _bert_folder, "Mistral-7B-v0.1": _mistral_v01_folder}


@dataclasses.dataclass
class Row:
    run: PublishedRun
    predicted: float  # the central prediction (for a length: where device_used_bytes reaches the card)
    prediction: str  # which of the plan's numbers
    decided: float | None = None  # for a length: the plan's max_seq_length, decided with margin_bytes

    @property
    def error(self) -> float | None:
        if not self.run.measured:
            return None
        return self.predicted / self.run.measured - 1

    @property
    def exceeds(self) -> bool:
        """The plan says a length fits that the measured run could not train."""
        return self.decided is not None and self.decided > self.run.measured


_PREDICTION_KEY = {"nvidia-smi": "device_used_bytes", "max_memory_reserved": "reserved_bytes",
                   "max_memory_allocated": "total_bytes", "max_seq_length": "max_seq_length",
                   "memory_allocated": "weights + optimizer"}


def predict(run: PublishedRun, root: Path) -> Row:
    fields = dict(run.request)
    if fields["model"] in _LOCAL_MODELS:
        fields["model"] = _LOCAL_MODELS[fields["model"]](root)
    request = PlanRequest(**fields)
    key = _PREDICTION_KEY[run.metric]
    if key == "max_seq_length":
        decided = plan(request)
        card = request.gpu_gb * GIB
        central = largest_fitting(lambda s: device_estimate(dataclasses.replace(request, seq_length=s))
                                  .memory.device_used.bytes <= card, 2, max_positions(load_config(request.model)))
        return Row(run, central, "device_used_bytes = the card", decided.max_seq_length)
    estimate = device_estimate(request)
    value = {"device_used_bytes": estimate.memory.device_used.bytes, "reserved_bytes": estimate.memory.reserved.bytes,
             "total_bytes": estimate.peak_bytes,
             "weights + optimizer": estimate.categories["weights"] + estimate.categories["optimizer"]}[key]
    return Row(run, value, key)


def _amount(value: float, metric: str) -> str:
    if metric == "max_seq_length":
        return f"{value:,.0f} tokens" if value else "none (OOM)"
    return f"{value / MIB:,.0f} MiB"


def published_table(rows: list[Row]) -> list[str]:
    lines = ["| source | settings | metric | measured | planner's prediction | error | planner's answer "
             "(with margin) |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        error = "agrees (none fits)" if row.error is None and not row.predicted else (
            "n/a" if row.error is None else f"{row.error:+.1%}")
        answer = "" if row.decided is None else (
            f"{_amount(row.decided, row.run.metric)}" + (" **exceeds**" if row.exceeds else ""))
        lines.append(f"| [{_short(row.run.source)}]({row.run.source}) | {row.run.setting} | {row.run.metric} | "
                     f"{_amount(row.run.measured, row.run.metric)} | {_amount(row.predicted, row.run.metric)} "
                     f"(`{row.prediction}`) | {error} | {answer} |")
    return lines


def _short(url: str) -> str:
    return {HF_SINGLE_GPU: "HF single-GPU guide", UNSLOTH_LLAMA_3_3: "Unsloth Llama 3.3 blog",
            TORCHTUNE_README: "torchtune README", FMS_ORCA_CSV: "fms-acceleration refs_orca"}.get(url, url)


def summary_lines(rows: list[Row]) -> list[str]:
    errors = [abs(row.error) for row in rows if row.error is not None]
    within = sum(error <= 0.10 for error in errors)
    lengths = [row for row in rows if row.run.metric == "max_seq_length"]
    over = [row for row in lengths if row.exceeds]
    return [f"median |error| {statistics.median(errors):.1%} over {len(errors)} measurements; within 10%: "
            f"{within} of {len(errors)}",
            f"longest sequence: the planner's answer (decided with its margin) exceeds the measured run's in "
            f"{len(over)} of {len(lengths)} cases"
            + (": " + ", ".join(row.run.setting for row in over) if over else "")]


def calibration_table() -> list[str]:
    lines = ["| input of memory_reserve.py | source | setting | value |", "|---|---|---|---|"]
    for measured in memory_reserve.PUBLISHED_RESERVE_GAPS:
        lines.append(f"| reserved - allocated, one stream | {measured.source} | {measured.setting} | "
                     f"{measured.bytes / GIB:.3f} GiB |")
    for measured in memory_reserve.PUBLISHED_SHARDED_SLACK:
        lines.append(f"| FSDP: (reserved - active) / (active - sharded state) | {measured.source} | "
                     f"{measured.setting} | {measured.bytes:.2f} |")
    for loading, figures in memory_reserve.CUDA_CONTEXT_BYTES.items():
        for measured in figures:
            lines.append(f"| CUDA context, {loading} loading | {measured.source} | {measured.setting} | "
                         f"{measured.bytes / MIB:,.0f} MiB |")
    return lines


def seed_table() -> list[str]:
    seed = seed_example_estimate()
    rows = [f"| {category} | {value / MIB:,.0f} |" for category, value in seed["categories"].items()]
    return ["| category | MiB |", "|---|---|", *rows,
            f"| estimated live peak ({seed['peak_moment']}) + the page's 1.3 GB context | "
            f"{seed['peak_bytes'] / MIB:,.0f} |",
            f"| measured (nvidia-smi, the anatomy page) | {SEED_MEASURED_MB:,} |"]


def pr_31629_table() -> list[str]:
    rows = ["| per-device batch | max length | checkpointing | padded MiB | packed MiB | change |",
            "|---|---|---|---|---|---|"]
    for batch_size, seq_length, checkpointing in ((4, 1024, False), (8, 1024, False), (8, 1024, True),
                                                  (16, 2048, True)):
        used = {}
        for packed in (False, True):
            request = PlanRequest(model="Llama-2-7b-hf", dataset="orcamath-like", samples=2048, packed=packed,
                                  batch_size=batch_size, seq_length=seq_length, precision="bf16",
                                  attention="flash_attention_2", gradient_checkpointing=checkpointing, gpus=8,
                                  shard="fsdp")
            used[packed] = device_estimate(request).memory.device_used.bytes / MIB
        rows.append(f"| {batch_size} | {seq_length} | {'yes' if checkpointing else 'no'} | {used[False]:,.0f} | "
                    f"{used[True]:,.0f} | {used[True] / used[False] - 1:+.1%} |")
    published = PR_31629_MB["packed"] / PR_31629_MB["padded"] - 1
    rows.append(f"| PR #31629 (settings not given) | | | {PR_31629_MB['padded']:,} | {PR_31629_MB['packed']:,} | "
                f"{published:+.1%} |")
    return rows


def korthikanti_table() -> list[str]:
    config = load_config("Llama-2-7b-hf")
    h, a, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    rows = ["| s x b | Korthikanti, scores kept | Korthikanti, no scores | this estimate, sdpa | "
            "this estimate, flash (CUDA) |",
            "|---|---|---|---|---|"]
    for s, b in ((2048, 1), (4096, 1)):
        full = s * b * h * (34 + 5 * a * s / h)
        no_scores = 34 * s * b * h
        ours = {}
        for attention in ("sdpa", "flash_attention_2"):
            settings = TrainingSettings(precision="bf16", attention=attention, device_type="cuda")
            terms = estimate_memory_detail(config, StepShape(b, s), settings).activation_terms
            per_layer = sum(v for k, v in terms.items() if k.startswith("layers.") or k.startswith("attention_"))
            ours[attention] = per_layer / layers
        rows.append(f"| {s} x {b} | {full / MIB:,.0f} MiB | {no_scores / MIB:,.0f} MiB | "
                    f"{ours['sdpa'] / MIB:,.0f} MiB | {ours['flash_attention_2'] / MIB:,.0f} MiB |")
    return rows


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [predict(run, Path(tmp)) for run in PUBLISHED_RUNS]
    for title, lines in (("Published measurements against the planner", published_table(rows) + [""]
                          + summary_lines(rows)),
                         ("The reserve model's inputs (memory_reserve.py)", calibration_table()),
                         ("bert-large seed (HF anatomy page)", seed_table()),
                         ("Llama-2-7B, OrcaMath, FSDP x 8 (transformers PR #31629), device used", pr_31629_table()),
                         ("Activations per layer, Llama-2-7B shape, bf16", korthikanti_table())):
        print(f"\n{title}\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
