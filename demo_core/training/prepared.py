"""A prepared run: the configuration as asked and as resolved, its model source and its tokenized data, made once by
`engine.prepare` and read by the preview, the bursts, the memory guard and the time prediction."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import platform

import torch
import transformers

from demo_core.batch_semantics import PER_DEVICE
from demo_core.collators import CollatorSpec, collator_spec
from demo_core.config import RunConfig
from demo_core.data import loading as data
from demo_core.errors import DemoInputError
from demo_core.models.sources import ModelSource
from demo_core.results import Comparison, Result
from demo_core.throughput.run_prediction import priced_for_run
from demo_core.throughput.work import ideal_speedup
from demo_core.training import distributed
from demo_core.training.trainers import TrainingRows

# What the documents' `config` records beside the settings as asked (e.g. "resolved_attention": "varlen").
RESOLVED_IN_DOCUMENTS = ("attention", "device", "precision", "threads", "loss_on", "gradient_checkpointing")
LIBRARIES = ("trl", "peft", "datasets", "accelerate")  # versions in `environment`, besides torch and transformers


@dataclasses.dataclass
class Prepared:
    """A validated run, its model source and its tokenized data: what preview, training and the page share."""

    config: RunConfig  # as asked (validated): what the documents record and the page shows
    resolved: RunConfig  # as it trains, every "auto" decided (RunConfig.resolved): what every burst reads
    source: ModelSource
    dataset: data.TokenizedDataset

    @property
    def specs(self) -> list[CollatorSpec]:
        return [collator_spec(name) for name in self.config.collators]

    @property
    def examples(self) -> list[list[int]]:
        return self.dataset.examples

    @functools.cached_property
    def rows(self) -> TrainingRows:
        return TrainingRows(self.dataset, self.config.max_length)

    @property
    def effective_batch_size(self) -> int:
        """Examples (bfd: rows) per optimizer step over every process and micro-batch."""
        return self.config.examples_per_step * distributed.world_size()

    @functools.cached_property
    def ideal_speedup(self) -> float:
        return ideal_speedup(self.examples, self.effective_batch_size, self.config.steps, distributed.world_size(),
                             grad_accum=self.config.grad_accum)

    @functools.cached_property
    def priced_on_device(self) -> dict[str, dict] | None:
        """This run's own batches priced by the step-time model on the device it trains on (a CPU at its measured
        rates, a GPU of the table): per collator `step_s`, `tokens_per_s`, `speedup_vs_padded`. None where it has no
        entry for the device."""
        try:
            # ZeroGPU's server process has no card until a worker attaches one: no name, no entry, no prediction
            device_name = torch.cuda.get_device_name() if self.resolved.device == "cuda" else None
        except (RuntimeError, AssertionError):
            return None
        try:
            return priced_for_run(self.resolved, self.source.config, [len(ids) for ids in self.examples], device_name)
        except DemoInputError:  # a precision the GPU of the table has no rate for: no prediction, the run stands
            return None

    @property
    def predicted_speedups(self) -> dict[str, float] | None:
        """Each collator's speedup over padded as the step-time model predicts it for this run's own batches."""
        priced = self.priced_on_device
        return None if priced is None else {name: entry["speedup_vs_padded"] for name, entry in priced.items()}

    def document_config(self) -> dict:
        """The documents' `config`: the settings as asked, what the engine resolved of them, and what the batch size
        means (batch_semantics.py)."""
        return {**self.config.to_dict(),
                **{f"resolved_{name}": getattr(self.resolved, name) for name in RESOLVED_IN_DOCUMENTS},
                "batch_semantics": PER_DEVICE, "effective_batch_size": self.effective_batch_size,
                "model_type": self.source.config.model_type}

    def comparison(self, results: list[Result], contamination: list[dict] | None = None,
                   contamination_not_checked: str | None = None, memory: dict | None = None) -> Comparison:
        """The run's document so far: partial while a collator is missing or was stopped mid-burst."""
        return Comparison(
            config=self.document_config(),
            dataset_stats=self.dataset.stats_dict(),
            results=list(results),
            ideal_speedup=self.ideal_speedup,
            contamination=contamination or [],
            environment=environment(self.resolved.device),
            partial=any(result.partial for result in results) or len(results) < len(self.config.collators),
            contamination_not_checked=contamination_not_checked,
            memory_guard=memory,
            predicted_speedups=self.predicted_speedups,
        )


def environment(device: str) -> dict:
    """The machine and the libraries a run trained with (trl, peft and datasets too: an emitted script needs them)."""
    info = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": device, "cpu_threads": torch.get_num_threads(), "world_size": distributed.world_size(),
            **{name: importlib.metadata.version(name) for name in LIBRARIES}}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info
