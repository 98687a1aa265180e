"""run_comparison: the same examples, in the same order, from the same initial weights, once per collator.

Also `preview`: the numbers the app shows before any training (length statistics, the first batch under each
collator, the cost of padding and of attention), computed from the tokenized data alone.
"""

from __future__ import annotations

import dataclasses
import platform
import threading
from typing import Callable

import torch
import transformers

from . import data, distributed
from .burst import BurstSettings, ProgressFn, release_memory, run_burst, training_dataset
from .collators import make_collator
from .config import Limits, RunConfig
from .contamination import contamination_check
from .errors import DemoInputError
from .models import ModelSource, accepts_position_ids, load_model_source, max_positions
from .preflight import PACKING_COLLATORS, exact_attention
from .results import Comparison, Result
from .trl_path import SAME_BATCHES_AS, TRL_COLLATORS, run_trl_burst


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise DemoInputError("device 'cuda' requested but no CUDA GPU is available here")
    return requested


def resolve_precision(requested: str, device: str) -> str:
    """auto: bf16 where the GPU supports it, fp32 on CPU (CPU bf16 autocast is slower than fp32)."""
    if requested == "auto":
        return "bf16" if device == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if requested == "fp16" and device != "cuda":
        raise DemoInputError("fp16 mixed precision needs a CUDA GPU; use fp32 or bf16 on CPU")
    return requested


def padded_step_costs(examples: list[list[int]], batch_size: int, steps: int) -> list[tuple[int, int]]:
    """(real tokens, padded slots) per step for padding to the batch's longest, reading the data in order."""
    costs = []
    for step in range(steps):
        start = (step * batch_size) % len(examples)
        batch = [examples[(start + i) % len(examples)] for i in range(batch_size)]
        lengths = [len(ids) for ids in batch]
        costs.append((sum(lengths), batch_size * max(lengths)))
    return costs


def ideal_speedup(examples: list[list[int]], batch_size: int, steps: int, world_size: int = 1) -> float:
    """Padded slots / real tokens over the timed steps: the speedup if step time were proportional to slots.

    Under DDP each rank pads only its own batch_size / world_size examples (consecutive shares of the global batch).
    """
    costs = padded_step_costs(examples, batch_size // world_size, steps * world_size)
    timed = costs[world_size:] if steps > 1 else costs
    return sum(slots for _, slots in timed) / sum(real for real, _ in timed)


@dataclasses.dataclass
class Prepared:
    """A validated run, its model source and its tokenized data: what both `preview` and `run_comparison` need."""

    config: RunConfig
    source: ModelSource
    dataset: data.TokenizedDataset
    device: str
    precision: str
    attention: str


def prepare(config: RunConfig, limits: Limits | None = None) -> Prepared:
    limits = limits or Limits()
    config = config.validated(limits)
    distributed.per_device_batch_size(config.batch_size)  # fails on every rank alike, before any collective
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    source = load_model_source(config.model)
    positions = max_positions(source.config)
    if positions is not None and config.max_length > positions:
        raise DemoInputError(f"max length {config.max_length} exceeds what {config.model} supports ({positions})")
    packing = [name for name in config.collators if name in PACKING_COLLATORS]
    if packing and not accepts_position_ids(source.config):
        raise DemoInputError(
            f"{source.family} models take no position_ids, so {', '.join(packing)} cannot restart positions per "
            f"example; run them with padded or padded-grouped only"
        )
    # Before anything trains: a tiny forward proves packing exact for this model on this path, or refuses the run.
    attention = exact_attention(source, config.attention, device, config.collators)
    dataset = data.load(config.dataset, source.tokenizer, config.samples, config.seed, config.max_length,
                        limits.max_upload_bytes)
    return Prepared(config, source, dataset, device, precision, attention)


def environment(device: str) -> dict:
    info = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": device, "cpu_threads": torch.get_num_threads(), "world_size": distributed.world_size()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def preview(config: RunConfig, limits: Limits | None = None) -> dict:
    """Numbers for the no-training views: length stats, the first batch per collator, cost preview."""
    prepared = prepare(config, limits)
    config, examples = prepared.config, prepared.dataset.examples
    first = examples[: config.batch_size]
    lengths = [len(ids) for ids in first]
    batches = {}
    for name in config.collators:
        row_lengths = None  # bfd only: the example lengths inside each packed row, for drawing the rows
        builder = SAME_BATCHES_AS.get(name, name)
        if builder == "bfd":
            rows = training_dataset(examples, "bfd", config.max_length)[: config.batch_size]
            features = [{"input_ids": ids, "seq_lengths": lens} for ids, lens in zip(rows["input_ids"], rows["seq_lengths"])]
            row_lengths = [list(lens) for lens in rows["seq_lengths"]]
        else:
            features = [{"input_ids": ids} for ids in first]
        collator = make_collator(builder, prepared.source.tokenizer)
        batch = collator(features)
        stats = collator.pending_stats.popleft()
        batches[name] = {
            **dataclasses.asdict(stats),
            "pad_fraction": stats.pad_fraction,
            "position_ids": batch["position_ids"][0].tolist() if "position_ids" in batch else None,
            "labels": batch["labels"].tolist(),
            "shape": list(batch["input_ids"].shape),
            "row_lengths": row_lengths,
        }
    padded_costs = padded_step_costs(examples, config.batch_size, config.steps)
    return {
        "config": config.to_dict(),
        "dataset_stats": prepared.dataset.stats_dict(),
        "lengths": [len(ids) for ids in examples],
        "attention": prepared.attention,
        "device": prepared.device,
        "batches": batches,
        "cost": {
            "pad_fraction": 1.0 - sum(r for r, _ in padded_costs) / sum(s for _, s in padded_costs),
            "ideal_speedup": ideal_speedup(examples, config.batch_size, config.steps),
            # Attention scores for the first batch: per-segment (varlen/flash) vs padded grid vs dense packed mask.
            "attention_scores_varlen": sum(n * n for n in lengths),
            "attention_scores_padded": len(lengths) * max(lengths) ** 2,
            "attention_scores_dense_packed": sum(lengths) ** 2,
            "optimizer_steps": config.steps,
        },
    }


def _run_burst_or_explain_oom(prepared: Prepared, examples, name: str, settings: BurstSettings,
                              progress: ProgressFn | None, stop_event: threading.Event | None) -> Result:
    """A burst that runs out of GPU memory becomes a user message; the memory is released for the next run."""
    try:
        burst = run_trl_burst if name in TRL_COLLATORS else run_burst
        return burst(prepared.source, examples, name, prepared.attention, settings, progress, stop_event)
    except torch.OutOfMemoryError:
        pass  # leave the except block first, so the traceback (and the tensors its frames hold) can be freed
    release_memory()
    raise DemoInputError(
        f"out of GPU memory while training {name!r} (batch size {settings.batch_size}, max length "
        f"{settings.max_length}, {prepared.config.model}): try a smaller batch size or max length"
    )


def run_comparison(config: RunConfig, limits: Limits | None = None, progress: ProgressFn | None = None,
                   stop_event: threading.Event | None = None,
                   on_result: Callable[[Result], None] | None = None) -> Comparison:
    """Runs every requested collator and returns the comparison; `on_result` sees each result as it finishes."""
    try:
        return _run_comparison(config, limits, progress, stop_event, on_result)
    finally:
        release_memory()  # after a failed or stopped run too


def _run_comparison(config: RunConfig, limits: Limits | None, progress: ProgressFn | None,
                    stop_event: threading.Event | None, on_result: Callable[[Result], None] | None) -> Comparison:
    prepared = prepare(config, limits)
    config = prepared.config
    settings = BurstSettings(
        steps=config.steps, batch_size=config.batch_size, max_length=config.max_length,
        learning_rate=config.learning_rate, optimizer=config.optimizer, precision=prepared.precision,
        device=prepared.device, seed=config.seed, gradient_checkpointing=config.gradient_checkpointing,
    )
    examples = prepared.dataset.examples
    results: list[Result] = []
    for name in config.collators:
        if stop_event is not None and stop_event.is_set():
            break
        result = _run_burst_or_explain_oom(prepared, examples, name, settings, progress, stop_event)
        results.append(result)
        if on_result is not None:
            on_result(result)
    # Rank 0 alone reports, so only it needs the check (a forward pass per example, no collective); a stopped run
    # skips it, so that Stop ends the run promptly.
    stopped = stop_event is not None and stop_event.is_set()
    contamination = []
    if distributed.is_main_process() and not stopped:
        contamination = contamination_check(prepared.source, prepared.attention,
                                            examples[: min(config.batch_size, 8)], prepared.device, config.seed)
    return Comparison(
        config={**config.to_dict(), "resolved_attention": prepared.attention, "resolved_device": prepared.device,
                "resolved_precision": prepared.precision},
        dataset_stats=prepared.dataset.stats_dict(),
        results=results,
        ideal_speedup=ideal_speedup(examples, config.batch_size, config.steps, distributed.world_size()),
        contamination=contamination,
        environment=environment(prepared.device),
        partial=any(result.partial for result in results) or len(results) < len(config.collators),
    )
