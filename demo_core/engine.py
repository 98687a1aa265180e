"""A run's lifecycle: `prepare` once, then `preview` and `run_comparison` on the same `Prepared` run.

`prepare(config)` validates the config, loads the model source (config + tokenizer; weights are built per burst)
and tokenizes the data: the expensive, fallible part, done once per run. `preview(prepared)` gives the numbers the
page shows before any training (length statistics, the first batch under each collator, the cost of padding and of
attention); `run_comparison(prepared)` trains every collator on the same examples, in the same order, from the
same initial weights. Both also accept a `RunConfig` and prepare it themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import threading
from typing import Callable, Iterable

import torch
import transformers

from . import data, distributed
from .anatomy import PROFILED_STEP, initialize_profiler
from .attention import capability
from .burst import BurstSettings, ProgressFn, release_memory, run_burst
from .collators import CollatorSpec, collator_spec
from .config import Limits, RunConfig
from .contamination import contamination_check
from .errors import DemoInputError
from .lora_burst import check_lora_targets, check_qlora
from .models import ModelSource, accepts_position_ids, load_model_source, max_positions
from .preflight import exact_attention
from .results import Comparison, Result
from .timing import Turns, timed_step_indices, torch_threads
from .trainers import TrainingRows


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


def resolve_threads(requested: int | None, device: str) -> int | None:
    """None: 1 thread on a CPU, torch's own choice on a GPU (its host threads only launch kernels).

    One thread, because CPUs are often shared (a Space, CI, a laptop): with two, every parallel operator waits at
    its barrier for a thread the OS gave to other work. Measured with one other process spinning on a shared
    2-core machine (benchmarks/speedup_stability.py, docs/RESULTS.md): three default runs gave flatten 2.02x /
    2.73x / 1.87x with torch's 2 threads, and 2.30x / 2.11x / 2.05x with one, minutes apart.
    """
    return 1 if requested is None and device == "cpu" else requested


def padded_step_costs(examples: list[list[int]], batch_size: int, steps: int) -> list[tuple[int, int]]:
    """(real tokens, padded slots) per step for padding to the batch's longest, batching as the Trainer does:
    in order, epoch after epoch, the last batch of an epoch holding what is left (no wrap-around into the next)."""
    batches_per_epoch = -(-len(examples) // batch_size)
    costs = []
    for step in range(steps):
        start = (step % batches_per_epoch) * batch_size
        lengths = [len(ids) for ids in examples[start:start + batch_size]]
        costs.append((sum(lengths), len(lengths) * max(lengths)))
    return costs


def ideal_speedup(examples: list[list[int]], batch_size: int, steps: int, world_size: int = 1,
                  profiled_step: int | None = PROFILED_STEP) -> float:
    """Padded slots / real tokens over the timed steps (all steps when none is timed): the speedup if step time
    were proportional to slots.

    Under DDP each rank pads only its own batch_size / world_size examples (consecutive shares of the global batch).
    """
    costs = padded_step_costs(examples, batch_size // world_size, steps * world_size)
    timed = [costs[index * world_size + rank] for index in timed_step_indices(steps, profiled_step)
             for rank in range(world_size)] or costs
    return sum(slots for _, slots in timed) / sum(real for real, _ in timed)


@dataclasses.dataclass
class Prepared:
    """A validated run, its model source and its tokenized data: what preview, training and the page share."""

    config: RunConfig
    source: ModelSource
    dataset: data.TokenizedDataset
    device: str
    precision: str
    attention: str
    threads: int | None

    @property
    def specs(self) -> list[CollatorSpec]:
        return [collator_spec(name) for name in self.config.collators]

    @property
    def examples(self) -> list[list[int]]:
        return self.dataset.examples

    @functools.cached_property
    def rows(self) -> TrainingRows:
        return TrainingRows(self.examples, self.config.max_length)

    @functools.cached_property
    def ideal_speedup(self) -> float:
        return ideal_speedup(self.examples, self.config.batch_size, self.config.steps, distributed.world_size())

    def burst_settings(self) -> BurstSettings:
        config = self.config
        return BurstSettings(
            steps=config.steps, batch_size=config.batch_size, max_length=config.max_length,
            learning_rate=config.learning_rate, optimizer=config.optimizer, precision=self.precision,
            device=self.device, seed=config.seed, gradient_checkpointing=config.gradient_checkpointing,
            lora_rank=config.lora_rank, lora_targets=config.lora_targets, qlora=config.qlora,
        )

    def comparison(self, results: list[Result], contamination: list[dict] | None = None) -> Comparison:
        """The run's document so far: partial while a collator is missing or was stopped mid-burst."""
        return Comparison(
            config={**self.config.to_dict(), "resolved_attention": self.attention, "resolved_device": self.device,
                    "resolved_precision": self.precision, "resolved_threads": self.threads},
            dataset_stats=self.dataset.stats_dict(),
            results=list(results),
            ideal_speedup=self.ideal_speedup,
            contamination=contamination or [],
            environment=environment(self.device),
            partial=any(result.partial for result in results) or len(results) < len(self.config.collators),
        )


def prepare(config: RunConfig, limits: Limits | None = None, dataset_file: str | os.PathLike | None = None) -> Prepared:
    """`dataset_file`: where to read the data when it is a private file (a visitor's upload); `config.dataset` is then
    only its display name, so the documents record the name and `data.file_record`, never the server path."""
    limits = limits or Limits()
    config = config.validated(limits)
    distributed.per_device_batch_size(config.batch_size)  # fails on every rank alike, before any collective
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    source = load_model_source(config.model)
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
                        config.samples, config.seed, config.max_length, limits.max_upload_bytes)
    if config.batch_size > len(dataset.examples):
        dataset.notes.append(f"batch size {config.batch_size} is more than the {len(dataset.examples)} examples: "
                             f"every step trains on all {len(dataset.examples)}")
    return Prepared(config, source, dataset, device, precision, attention, resolve_threads(config.threads, device))


def _prepared(run: RunConfig | Prepared, limits: Limits | None) -> Prepared:
    return run if isinstance(run, Prepared) else prepare(run, limits)


def environment(device: str) -> dict:
    info = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": device, "cpu_threads": torch.get_num_threads(), "world_size": distributed.world_size()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _first_batch(prepared: Prepared, spec: CollatorSpec) -> dict:
    """The first batch this collator builds from the run's data, with what the page draws of it."""
    config, examples = prepared.config, prepared.examples
    if spec.packed_rows:
        rows = prepared.rows.packed[: config.batch_size]
        features = [{"input_ids": ids, "seq_lengths": lengths}
                    for ids, lengths in zip(rows["input_ids"], rows["seq_lengths"])]
    else:
        features = [{"input_ids": ids} for ids in examples[: config.batch_size]]
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
    """Numbers for the no-training views: length stats, the first batch per collator, cost preview, and the run's
    predicted time (`predicted`, from the seconds per slot of `earlier_runs`, documents of earlier runs, if any)."""
    from .duration import predicted  # duration.py reads this module's step costs

    prepared = _prepared(run, limits)
    config, examples = prepared.config, prepared.examples
    lengths = [len(ids) for ids in examples[: config.batch_size]]
    padded_costs = padded_step_costs(examples, config.batch_size, config.steps)
    return {
        "config": config.to_dict(),
        "dataset_stats": prepared.dataset.stats_dict(),
        "lengths": [len(ids) for ids in examples],
        "attention": prepared.attention,
        "attention_why": capability(prepared.source.config, prepared.attention, prepared.device)[1],
        "device": prepared.device,
        "batches": {spec.name: _first_batch(prepared, spec) for spec in prepared.specs},
        "cost": {
            "pad_fraction": 1.0 - sum(r for r, _ in padded_costs) / sum(s for _, s in padded_costs),
            "ideal_speedup": ideal_speedup(examples, config.batch_size, config.steps),
            # Attention scores for the first batch: per-segment (varlen/flash) vs padded grid vs dense packed mask.
            "attention_scores_varlen": sum(n * n for n in lengths),
            "attention_scores_padded": len(lengths) * max(lengths) ** 2,
            "attention_scores_dense_packed": sum(lengths) ** 2,
            "optimizer_steps": config.steps,
        },
        "predicted": predicted(prepared, earlier_runs),
    }


def _run_burst_or_explain_oom(prepared: Prepared, spec: CollatorSpec, settings: BurstSettings,
                              progress: ProgressFn | None, stop_event: threading.Event | None,
                              turns: Turns | None = None) -> Result:
    """A burst that runs out of GPU memory becomes a user message; the memory is released for the next run."""
    try:
        return run_burst(prepared.source, prepared.rows, spec, prepared.attention, settings, progress, stop_event,
                         turns)
    except torch.OutOfMemoryError:
        pass  # leave the except block first, so the traceback (and the tensors its frames hold) can be freed
    release_memory()
    raise DemoInputError(
        f"out of GPU memory while training {spec.name!r} (batch size {settings.batch_size}, max length "
        f"{settings.max_length}, {prepared.config.model}): try a smaller batch size or max length"
    )


def run_comparison(run: RunConfig | Prepared, limits: Limits | None = None, progress: ProgressFn | None = None,
                   stop_event: threading.Event | None = None,
                   on_result: Callable[[Result], None] | None = None) -> Comparison:
    """Runs every requested collator and returns the comparison; `on_result` sees each result as it finishes
    (on a CPU, where the bursts alternate step by step, they all finish together)."""
    initialize_profiler()  # from the caller's thread, before any burst profiles in its own
    prepared = _prepared(run, limits)
    try:
        with torch_threads(prepared.threads):
            return _run_comparison(prepared, progress, stop_event, on_result)
    finally:
        release_memory()  # after a failed or stopped run too


def takes_turns(device: str) -> bool:
    """Whether the collators' bursts alternate step by step on this device. On a CPU they do: a CPU is often shared
    (a Space, a laptop, CI), and collators run minutes apart would see different loads. On a GPU they run one after
    the other: a GPU is dedicated, and its peak memory per phase (max_memory_allocated) would otherwise include the
    other collators' resident models and optimizer state."""
    return device == "cpu"


def _sequential_bursts(prepared: Prepared, settings: BurstSettings, progress: ProgressFn | None,
                       stop_event: threading.Event | None, on_result: Callable[[Result], None] | None) -> list[Result]:
    results: list[Result] = []
    for spec in prepared.specs:
        if stop_event is not None and stop_event.is_set():
            break
        results.append(_run_burst_or_explain_oom(prepared, spec, settings, progress, stop_event))
        release_memory()  # this collator's model and optimizer, before the next one's are built
        if on_result is not None:
            on_result(results[-1])
    return results


def _alternating_bursts(prepared: Prepared, settings: BurstSettings, progress: ProgressFn | None,
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
            outcomes[spec.name] = _run_burst_or_explain_oom(prepared, spec, settings, progress, stop_event, turns)
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


def _run_comparison(prepared: Prepared, progress: ProgressFn | None, stop_event: threading.Event | None,
                    on_result: Callable[[Result], None] | None) -> Comparison:
    if stop_event is not None and stop_event.is_set():  # stopped while the run was prepared: no step to take
        return prepared.comparison([])
    settings = prepared.burst_settings()
    bursts = _alternating_bursts if takes_turns(prepared.device) and len(prepared.specs) > 1 else _sequential_bursts
    results = bursts(prepared, settings, progress, stop_event, on_result)
    # Rank 0 alone reports, so only it needs the check (a forward pass per example, no collective); a run cut short
    # skips it, so that Stop ends the run promptly. Cut short is what the results say, not the signal: a time budget
    # that runs out after the last step has stopped nothing.
    finished = prepared.comparison(results)
    if finished.partial or not distributed.is_main_process():
        return finished
    contamination = contamination_check(prepared.source, prepared.attention,
                                        prepared.examples[: min(prepared.config.batch_size, 8)], prepared.device,
                                        prepared.config.seed)
    return prepared.comparison(results, contamination)
