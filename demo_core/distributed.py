"""Several processes (torchrun / accelerate launch): who we are, how the batch splits, and the group's view of a burst.

Both launchers start one process per device and export RANK and WORLD_SIZE before our code runs, so `rank()` and
`world_size()` read the environment: they give the same answer before Trainer creates the process group (argument
checks must fail on every rank before any collective, or the ranks that passed would wait forever) and after.
Rank 0 alone runs the contamination check, prints the table and writes the JSON; the other ranks train and exit 0.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch.distributed as dist

from .errors import DemoInputError
from .results import Result


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    return rank() == 0


def per_device_batch_size(batch_size: int, grad_accum: int = 1) -> int:
    """`--batch-size` is the global batch (examples per optimizer step, as in one process); each rank takes a share,
    in `grad_accum` micro-batches."""
    processes = world_size()
    if batch_size % processes:
        raise DemoInputError(f"batch size {batch_size} is the global batch and must divide evenly over the "
                             f"{processes} processes (per process: batch size / {processes})")
    if batch_size % (processes * grad_accum):
        raise DemoInputError(f"batch size {batch_size} must divide evenly into {grad_accum} gradient accumulation "
                             f"micro-batches on each of the {processes} processes")
    return batch_size // (processes * grad_accum)


def gather(value) -> list:
    """Every rank's `value` in rank order, on every rank. A collective: all ranks must call it, or none."""
    if world_size() == 1 or not dist.is_initialized():
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def merge_ranks(result: Result) -> Result:
    """One burst as the whole group ran it, the same on every rank (a collective: every rank calls it per burst).

    Per step: the loss is the mean over ranks, because with `average_tokens_across_devices` each rank's loss is its
    summed token loss / the global token count x world size, so the mean is the loss of the global batch; tokens,
    slots, examples and work (FLOPs) add up; the step lasts as long as the slowest rank, whose gradients DDP's
    all-reduce waits for. The time anatomy stays this rank's own.
    """
    ranks = gather(result)

    def per_step(field: str, combine) -> list:
        return [combine(values) for values in zip(*(getattr(r, field) for r in ranks))]

    return dataclasses.replace(
        result,
        losses=per_step("losses", lambda values: sum(values) / len(values)),
        step_times_s=per_step("step_times_s", max),
        step_real_tokens=per_step("step_real_tokens", sum),
        step_trained_tokens=per_step("step_trained_tokens", sum),
        step_padded_slots=per_step("step_padded_slots", sum),
        step_examples=per_step("step_examples", sum),
        step_collate_s=per_step("step_collate_s", max),
        step_work_flops=per_step("step_work_flops", sum),
        peak_memory_bytes=max((r.peak_memory_bytes for r in ranks if r.peak_memory_bytes is not None), default=None),
        partial=any(r.partial for r in ranks),
        world_size=len(ranks),
        rank_step_real_tokens=[r.step_real_tokens for r in ranks],
        rank_peak_memory_bytes=[r.peak_memory_bytes for r in ranks],
    )


def wait_for_failing_ranks(timeout_s: float = 30.0) -> None:
    """Called by a rank that has printed a user error and is about to exit.

    The launcher stops every rank as soon as one exits with an error, so without this only the fastest rank would get
    to print the error. Each failing rank checks in on the launcher's own key-value store (there may be no process
    group yet) and leaves once all have, or after `timeout_s` if some rank did not fail (a file missing on one node
    only): a bounded wait, never a hang.
    """
    if world_size() == 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    key = f"packing-lab/failed/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        if store.add(key, 1) == world_size():
            store.set(key + "/all", "1")
        store.wait([key + "/all"])
    except dist.DistError:
        pass  # the store is gone or some rank never failed: exit anyway


def close() -> None:
    """Ends the process group Trainer created, so the launcher sees a clean exit (NCCL warns otherwise)."""
    if dist.is_initialized():
        dist.destroy_process_group()
