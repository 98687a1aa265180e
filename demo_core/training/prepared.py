"""A prepared run: the configuration as asked and as resolved, its model source and its tokenized data, made once by
`engine.prepare` and read by the preview, the bursts, the memory guard and the time prediction."""

from __future__ import annotations

import dataclasses
import functools
import platform

import torch
import transformers

from demo_core.collators import CollatorSpec, collator_spec
from demo_core.config import RunConfig
from demo_core.data import loading as data
from demo_core.errors import DemoInputError
from demo_core.models.sources import ModelSource
from demo_core.results import Comparison, Result
from demo_core.throughput.run_prediction import predicted_for_run
from demo_core.throughput.work import ideal_speedup
from demo_core.training import distributed
from demo_core.training.trainers import TrainingRows

# What the documents' `config` records beside the settings as asked (e.g. "resolved_attention": "varlen").
RESOLVED_IN_DOCUMENTS = ("attention", "device", "precision", "threads", "loss_on", "gradient_checkpointing")


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

    @functools.cached_property
    def ideal_speedup(self) -> float:
        return ideal_speedup(self.examples, self.config.batch_size, self.config.steps, distributed.world_size(),
                             grad_accum=self.config.grad_accum)

    @functools.cached_property
    def predicted_speedups(self) -> dict[str, float] | None:
        """Each collator's speedup over padded as the step-time model predicts it for this run's own batches on the
        device it trains on (a CPU at its measured rates, a GPU of the table); None where it has no prediction."""
        device_name = torch.cuda.get_device_name() if self.resolved.device == "cuda" else None
        try:
            return predicted_for_run(self.resolved, self.source.config, [len(ids) for ids in self.examples],
                                     device_name)
        except DemoInputError:  # a precision the GPU of the table has no rate for: no prediction, the run stands
            return None

    def document_config(self) -> dict:
        """The documents' `config`: the settings as asked, and what the engine resolved of them."""
        return {**self.config.to_dict(),
                **{f"resolved_{name}": getattr(self.resolved, name) for name in RESOLVED_IN_DOCUMENTS}}

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
    info = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": device, "cpu_threads": torch.get_num_threads(), "world_size": distributed.world_size()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info
