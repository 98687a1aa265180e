"""A run's lifecycle: `prepare` once, then `preview` and `run_comparison` on the same `Prepared` run.

`prepare(config)` validates the config, loads the model source (config + tokenizer; weights are built per burst)
and tokenizes the data: the expensive, fallible part, done once per run. `preview(prepared)` gives the numbers the
page shows before any training (length statistics, the first batch under each collator, the cost of padding and of
attention); `run_comparison(prepared)` trains every collator on the same examples, in the same order, from the
same initial weights. Both also accept a `RunConfig` and prepare it themselves.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Callable, Iterable

import torch

from demo_core import precision as precisions
from demo_core.attention.capability import capability
from demo_core.attention.contamination import contamination_check
from demo_core.attention.preflight import exact_attention
from demo_core.caches import release_memory
from demo_core.collators import CollatorSpec, collator_spec
from demo_core.config import Limits, RunConfig
from demo_core.data import loading as data
from demo_core.errors import DemoInputError
from demo_core.isolation import torch_threads
from demo_core.models.sources import accepts_position_ids, load_model_source, max_positions
from demo_core.results import Comparison, Result
from demo_core.throughput.work import ideal_speedup, padded_step_costs
from demo_core.training import distributed, memory_guard
from demo_core.training.anatomy import initialize_profiler
from demo_core.training.burst import ProgressFn, run_burst
from demo_core.training.duration import predicted
from demo_core.training.lora import check_lora_targets, check_qlora
from demo_core.training.prepared import Prepared
from demo_core.training.turns import Turns, takes_turns


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise DemoInputError("device 'cuda' requested but no CUDA GPU is available here")
    return requested


def resolve_threads(requested: int | None, device: str) -> int | None:
    """None: 1 thread on a CPU, torch's own choice on a GPU (its host threads only launch kernels).

    One thread, because CPUs are often shared (a Space, CI, a laptop): with two, every parallel operator waits at
    its barrier for a thread the OS gave to other work. Measured with one other process spinning on a shared
    2-core machine (benchmarks/speedup_stability.py, docs/RESULTS.md): three default runs gave flatten 2.02x /
    2.73x / 1.87x with torch's 2 threads, and 2.30x / 2.11x / 2.05x with one, minutes apart.
    """
    return 1 if requested is None and device == "cpu" else requested


def prepare(config: RunConfig, limits: Limits | None = None, dataset_file: str | os.PathLike | None = None) -> Prepared:
    """`dataset_file`: where to read the data when it is a private file (a visitor's upload); `config.dataset` is then
    only its display name, so the documents record the name and `data.file_record`, never the server path."""
    limits = limits or Limits()
    config = config.validated(limits)
    # fails on every rank alike, before any collective
    distributed.per_device_batch_size(config.batch_size, config.grad_accum)
    device = resolve_device(config.device)
    precision = precisions.resolve(config.precision, device)
    source = load_model_source(config.model)
    distributed.check_fsdp(config.fsdp, device, source.config)
    positions = max_positions(source.config)
    if positions is not None and config.max_length > positions:
        raise DemoInputError(f"max length {config.max_length} exceeds what {config.model} supports ({positions})")
    packing = [name for name in config.collators if collator_spec(name).needs_position_ids]
    if packing and not accepts_position_ids(source.config):
        raise DemoInputError(
            f"{source.family} models take no position_ids, so {', '.join(packing)} cannot restart positions per "
            f"example; run them with padded or padded-grouped only"
        )
    if config.lora_rank:
        check_lora_targets(source.config, config.model, config.lora_targets)
    if config.qlora:
        check_qlora(device)
    # Before anything trains: a tiny forward proves packing exact for this model on this path, or refuses the run.
    attention = exact_attention(source, config.attention, device, config.collators)
    dataset = data.load(config.dataset if dataset_file is None else os.fspath(dataset_file), source.tokenizer,
                        config.samples, config.seed, config.max_length, limits.max_upload_bytes, config.loss_on)
    if config.batch_size > len(dataset.examples):
        dataset.notes.append(f"batch size {config.batch_size} is more than the {len(dataset.examples)} examples: "
                             f"every step trains on all {len(dataset.examples)}")
    resolved = config.resolved(device=device, precision=precision, attention=attention,
                               threads=resolve_threads(config.threads, device), loss_on=dataset.loss_on)
    return Prepared(config, resolved, source, dataset)


def _prepared(run: RunConfig | Prepared, limits: Limits | None) -> Prepared:
    return run if isinstance(run, Prepared) else prepare(run, limits)


def _first_batch(prepared: Prepared, spec: CollatorSpec) -> dict:
    """The first batch this collator builds from the run's data (with gradient accumulation: the first micro-batch,
    what one forward pass computes), with what the page draws of it; `labels` are -100 on the tokens that carry no
    loss (each example's first, padding, and the prompt's when the loss is on the completion or assistant)."""
    config, dataset = prepared.config, prepared.dataset
    if spec.packed_rows:
        rows = prepared.rows.packed[: config.micro_batch_size]
        features = [{"input_ids": ids, "labels": labels, "seq_lengths": lengths}
                    for ids, labels, lengths in zip(rows["input_ids"], rows["labels"], rows["seq_lengths"])]
    else:
        features = [{"input_ids": ids, "labels": labels} for ids, labels in
                    zip(dataset.examples[: config.micro_batch_size], dataset.labels)]
    collator = spec.collate(prepared.source.tokenizer)
    batch = collator(features)
    stats = collator.pending_stats.popleft()
    return {
        **dataclasses.asdict(stats),
        "pad_fraction": stats.pad_fraction,
        "position_ids": batch["position_ids"][0].tolist() if "position_ids" in batch else None,
        "labels": batch["labels"].tolist(),
        "shape": list(batch["input_ids"].shape),
        # packed rows only: the example lengths inside each row, for drawing the rows
        "row_lengths": [list(row["seq_lengths"]) for row in features] if spec.packed_rows else None,
    }


def preview(run: RunConfig | Prepared, limits: Limits | None = None, earlier_runs: Iterable[dict] = ()) -> dict:
    """Numbers for the no-training views: length stats and the first examples as trained (`dataset_stats`), the
    first batch per collator, cost preview, the run's predicted peak memory (`memory_guard`) and time (`predicted`,
    from the seconds per slot of `earlier_runs`, documents of earlier runs, if any)."""
    prepared = _prepared(run, limits)
    config, examples = prepared.config, prepared.examples
    lengths = [len(ids) for ids in examples[: config.micro_batch_size]]
    padded_costs = padded_step_costs(examples, config.batch_size, config.steps, config.grad_accum)
    return {
        "config": config.to_dict(),
        "dataset_stats": prepared.dataset.stats_dict(),
        "lengths": [len(ids) for ids in examples],
        "attention": prepared.resolved.attention,
        "attention_why": capability(prepared.source.config, prepared.resolved.attention, prepared.resolved.device)[1],
        "device": prepared.resolved.device,
        "batches": {spec.name: _first_batch(prepared, spec) for spec in prepared.specs},
        "cost": {
            "pad_fraction": 1.0 - sum(r for r, _ in padded_costs) / sum(s for _, s in padded_costs),
            "ideal_speedup": ideal_speedup(examples, config.batch_size, config.steps, grad_accum=config.grad_accum),
            # Attention scores for the first (micro-)batch: per-segment (varlen/flash) vs padded grid vs dense
            # packed mask.
            "attention_scores_varlen": sum(n * n for n in lengths),
            "attention_scores_padded": len(lengths) * max(lengths) ** 2,
            "attention_scores_dense_packed": sum(lengths) ** 2,
            "optimizer_steps": config.steps,
            "micro_batches_per_step": config.grad_accum,
        },
        # The run's predicted peak against the free memory, before Run (memory_guard.py)
        "memory_guard": memory_guard.preview_memory(prepared).to_dict(),
        "predicted": predicted(prepared, earlier_runs),
    }


def _run_burst_or_explain_oom(prepared: Prepared, spec: CollatorSpec,
                              progress: ProgressFn | None, stop_event: threading.Event | None,
                              turns: Turns | None = None) -> Result:
    """A burst that runs out of memory outside its training steps (building the model, moving it to the device)
    becomes a user message; the memory is released for the next run. Running out in a step ends the burst as a
    partial result instead (burst.py)."""
    try:
        return run_burst(prepared.source, prepared.rows, spec, prepared.resolved, progress, stop_event, turns)
    except (RuntimeError, MemoryError) as error:
        if not memory_guard.is_out_of_memory(error):
            raise
        where = "GPU memory" if isinstance(error, torch.OutOfMemoryError) else "memory"
        # leave the except block first, so the traceback (and the tensors its frames hold) can be freed
    release_memory()
    raise DemoInputError(
        f"out of {where} while training {spec.name!r} (batch size {prepared.config.batch_size}, max length "
        f"{prepared.config.max_length}, {prepared.config.model}): try a smaller batch size or max length"
    )


def run_comparison(run: RunConfig | Prepared, limits: Limits | None = None, progress: ProgressFn | None = None,
                   stop_event: threading.Event | None = None,
                   on_result: Callable[[Result], None] | None = None) -> Comparison:
    """Runs every requested collator and returns the comparison; `on_result` sees each result as it finishes
    (on a CPU, where the bursts alternate step by step, they all finish together)."""
    initialize_profiler()  # from the caller's thread, before any burst profiles in its own
    prepared = _prepared(run, limits)
    try:
        with torch_threads(prepared.resolved.threads):
            return _run_comparison(prepared, progress, stop_event, on_result)
    finally:
        release_memory()  # after a failed or stopped run too


def _sequential_bursts(prepared: Prepared, progress: ProgressFn | None,
                       stop_event: threading.Event | None, on_result: Callable[[Result], None] | None) -> list[Result]:
    results: list[Result] = []
    for spec in prepared.specs:
        if stop_event is not None and stop_event.is_set():
            break
        results.append(_run_burst_or_explain_oom(prepared, spec, progress, stop_event))
        release_memory()  # this collator's model and optimizer, before the next one's are built
        if on_result is not None:
            on_result(results[-1])
    return results


def _alternating_bursts(prepared: Prepared, progress: ProgressFn | None,
                        stop_event: threading.Event | None, on_result: Callable[[Result], None] | None) -> list[Result]:
    """Every collator's burst in its own thread, taking turns step by step (timing.Turns): their timed steps run
    ABAB..., so all see the same machine load, and only the thread holding the turn computes.

    A burst that fails aborts the others at their next step end; its error is raised once all have left. The
    DDP collectives (the per-step all-reduces, merge_ranks) stay in one order on every rank: every rank passes the
    turn in the same collator order after the same steps.
    """
    specs = prepared.specs
    turns = Turns([spec.name for spec in specs])
    outcomes: dict[str, Result | BaseException] = {}

    def burst(spec: CollatorSpec) -> None:
        turns.wait_for_turn(spec.name)
        try:
            if stop_event is not None and stop_event.is_set():
                return  # stopped before this collator's first step: no model to build, no step to take
            outcomes[spec.name] = _run_burst_or_explain_oom(prepared, spec, progress, stop_event, turns)
        except BaseException as error:  # handed to the caller's thread below
            outcomes[spec.name] = error
            turns.abort()
        finally:
            turns.leave(spec.name)

    threads = [threading.Thread(target=burst, args=(spec,), name=f"packing-lab-{spec.name}") for spec in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors = [outcome for outcome in outcomes.values() if isinstance(outcome, BaseException)]
    if errors:
        raise errors[0]
    results = [outcomes[spec.name] for spec in specs if spec.name in outcomes]
    for result in results if on_result is not None else []:
        on_result(result)
    return results


NOT_CHECKED_WHEN_PARTIAL = "the run ended before every collator finished; the check runs only after a complete run"


def _run_comparison(prepared: Prepared, progress: ProgressFn | None, stop_event: threading.Event | None,
                    on_result: Callable[[Result], None] | None) -> Comparison:
    if stop_event is not None and stop_event.is_set():  # stopped while the run was prepared: no step to take
        return prepared.comparison([])
    memory = memory_guard.refuse_if_too_big(prepared).to_dict()  # before anything trains
    bursts = _alternating_bursts if takes_turns(prepared.resolved.device) and len(prepared.specs) > 1 else _sequential_bursts
    results = bursts(prepared, progress, stop_event, on_result)
    # Rank 0 alone reports, so only it needs the check (a forward pass per example, no collective); a run cut short
    # skips it, so that Stop ends the run promptly. Cut short is what the results say, not the signal: a time budget
    # that runs out after the last step has stopped nothing.
    finished = prepared.comparison(results, memory=memory)
    if not distributed.is_main_process():
        return finished
    if finished.partial:
        return prepared.comparison(results, contamination_not_checked=NOT_CHECKED_WHEN_PARTIAL, memory=memory)
    rows, not_checked = contamination_check(prepared.source, prepared.resolved.attention,
                                            prepared.examples[: min(prepared.config.batch_size, 8)], prepared.resolved.device,
                                            prepared.config.seed)
    return prepared.comparison(results, rows, not_checked, memory)
