"""What a run document's batch size means, for documents saved before and after Hugging Face's batch semantics.

Every Hugging Face trainer multiplies: `per_device_train_batch_size` x `gradient_accumulation_steps` (x the number of
processes) examples make one optimizer step. Since issue 32 `batch_size` is that per-device micro-batch (packed rows
for bfd), and a document's `config` says so with `batch_semantics` and its `effective_batch_size` (batch size x
accumulation x processes). A document saved before has neither: its `batch_size` was the examples of one optimizer
step over all processes, split into `grad_accum` micro-batches of batch size / accumulation (/ processes) each, so
its effective batch is its batch size. `batch_shape` reads both; `as_per_device` turns an earlier document's settings
into today's meaning (the history puts them back into the inputs, a redraw prepares them).
"""

from __future__ import annotations

import dataclasses

PER_DEVICE = "per-device"  # config["batch_semantics"] of documents saved with Hugging Face's batch semantics


@dataclasses.dataclass(frozen=True)
class BatchShape:
    """One optimizer step of a run: `micro_batch_size` examples per process and forward, `grad_accum` forwards,
    `processes` processes."""

    micro_batch_size: int
    grad_accum: int
    processes: int
    saved_before: bool  # a document from before the per-device meaning (its batch_size was the whole step's)

    @property
    def effective_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.processes


def processes_of(document: dict) -> int:
    return int(document.get("environment", {}).get("world_size", 1) or 1)


def batch_shape(config: dict, processes: int = 1) -> BatchShape:
    """The step of a document's `config`, run on `processes` processes (its environment's world size)."""
    batch_size, grad_accum = int(config.get("batch_size", 1)), int(config.get("grad_accum", 1) or 1)
    if config.get("batch_semantics") == PER_DEVICE:
        return BatchShape(batch_size, grad_accum, processes, saved_before=False)
    return BatchShape(max(batch_size // (grad_accum * processes), 1), grad_accum, processes, saved_before=True)


def document_batch(document: dict) -> BatchShape:
    return batch_shape(document.get("config", {}), processes_of(document))


def as_per_device(config: dict, processes: int = 1) -> dict:
    """The settings of a document's `config` as today's RunConfig reads them: an earlier document's batch size
    becomes its micro-batch, so that running them again trains the same steps."""
    shape = batch_shape(config, processes)
    if not shape.saved_before:
        return dict(config)
    return {**config, "batch_size": shape.micro_batch_size, "batch_semantics": PER_DEVICE,
            "effective_batch_size": shape.effective_batch_size}
