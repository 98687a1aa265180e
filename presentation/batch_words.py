"""A run's batch in words, wherever the batch is shown (the CLI's report, the history, the page, the report file),
for documents saved before Hugging Face's batch semantics too (demo_core/batch_semantics.py): they keep the meaning
they were trained with and say so.
"""

from __future__ import annotations

from demo_core.batch_semantics import BatchShape, document_batch

SAVED_BEFORE = "saved before batch size meant the per-device micro-batch"


def shape_words(shape: BatchShape) -> str:
    """"batch 4 per device × 2 accumulation = 8 per step"; "batch 8" when nothing multiplies it; an earlier
    document's: "batch 8 in 2 micro-batches of 4 (saved before ...)"."""
    if shape.saved_before:
        if shape.grad_accum == 1 and shape.processes == 1:
            return f"batch {shape.effective_batch_size}"
        split = (f"in {shape.grad_accum} micro-batches of {shape.micro_batch_size}" if shape.grad_accum > 1
                 else f"of {shape.micro_batch_size}")
        over = f" per process on {shape.processes} processes" if shape.processes > 1 else ""
        return f"batch {shape.effective_batch_size} {split}{over} ({SAVED_BEFORE})"
    factors = [f"× {shape.grad_accum} accumulation" if shape.grad_accum > 1 else "",
               f"× {shape.processes} processes" if shape.processes > 1 else ""]
    factors = [factor for factor in factors if factor]
    if not factors:
        return f"batch {shape.micro_batch_size}"
    return f"batch {shape.micro_batch_size} per device {' '.join(factors)} = {shape.effective_batch_size} per step"


def batch_words(document: dict) -> str:
    return shape_words(document_batch(document))


def effective_batch_size(document: dict) -> int:
    """Examples (packed rows) per optimizer step, over every process and micro-batch, of a document of either
    meaning."""
    return document_batch(document).effective_batch_size
