"""Several processes (torchrun / accelerate launch): who we are and the group's view of a burst (each process trains its
own micro-batches of `--batch-size`, as every Hugging Face trainer does: batch_semantics.py).

Both launchers start one process per device and export RANK and WORLD_SIZE before our code runs, so `rank()` and
`world_size()` read the environment: they give the same answer before Trainer creates the process group (argument
checks must fail on every rank before any collective, or the ranks that passed would wait forever) and after.
Rank 0 alone runs the contamination check, prints the table and writes the JSON; the other ranks train and exit 0.

Two ways to spread a burst: DDP (the default) keeps a full copy of weights, gradients and optimizer state on every
process; FSDP (`--fsdp`) shards them with PyTorch's FSDP2 `fully_shard`, applied by Trainer's own FSDP support
(accelerate's plugin: each decoder layer, the embedding and the head tail, then the root, are a group whose full
weights are gathered only while that group computes). `fsdp_training_arguments` asks Trainer for it,
`check_fsdp` refuses what it cannot run, and `FSDPTrainerMixin` adapts accelerate where it stops short.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch.distributed.fsdp import MixedPrecisionPolicy
from transformers import PretrainedConfig

from demo_core.attention.capability import model_class
from demo_core.errors import DemoInputError
from demo_core.results import Result


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    return rank() == 0


def check_fsdp(fsdp: bool, device: str, config: PretrainedConfig) -> None:
    """Refuses what FSDP cannot run here, on every rank alike and before any collective (see the module docstring).
    `config`: the model's, whose causal LM class will train."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not fsdp:
        # accelerate would shard from its own config (perhaps FSDP1, offloading), unmeasured and unestimated here.
        raise DemoInputError("accelerate's own FSDP (accelerate launch --use_fsdp, or an FSDP accelerate config) is "
                             "not used here: launch with --multi_gpu and pass --fsdp, which shards with FSDP2 and "
                             "measures each process's shards")
    if not fsdp:
        return
    if world_size() == 1:
        raise DemoInputError("--fsdp shards weights, gradients and optimizer state over several processes: launch "
                             "with torchrun --nproc_per_node=N or accelerate launch --multi_gpu --num_processes N "
                             "(N of 2 or more); in one process there is nothing to shard over")
    if device == "cpu" and torch.cuda.is_available():
        # fully_shard builds its device mesh on the machine's accelerator, so CPU processes would get GPU shards.
        raise DemoInputError("--fsdp --device cpu needs the GPUs hidden (CUDA_VISIBLE_DEVICES= ): torch's fully_shard "
                             "places the shards on the GPU whenever one is visible; or run on cuda")
    causal_lm = model_class(type(config))
    if not getattr(causal_lm, "_no_split_modules", None):
        # Without layer groups the root group holds every layer, gathered whole from the forward to the backward.
        raise DemoInputError(f"{causal_lm.__name__} names no decoder layer class (_no_split_modules), which FSDP "
                             f"shards and gathers one at a time: it would gather the whole model at once; run it "
                             f"without --fsdp")


def fsdp_training_arguments(fsdp: bool) -> dict:
    """Trainer's FSDP2 (accelerate's plugin): TRANSFORMER_BASED_WRAP groups each of the model's `_no_split_modules`
    (its decoder layers), sharded again after their forward and gathered again for their backward."""
    return {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": True}} if fsdp else {}


class FSDPTrainerMixin:
    """Mixed into the trainers: Trainer's FSDP support, training as one process trains, on CPU processes too.

    - Precision stays the run's. With bf16 or fp16, accelerate's FSDP2 would not autocast; it would set FSDP's own
      mixed precision instead (weights gathered in half precision, norms run in it, gradients reduced in it):
      numerics one process does not have. Here FSDP's policy is left empty (fp32 gathered and reduced) and the
      forward runs under the same autocast as one process, so the losses are one process's and the memory is what
      the planner counts (fp32 layers gathered, autocast's half copies). The price: all-gathers of twice the bytes.
    - accelerate 1.15 turns its FSDP plugin on only for GPU-like process groups (`AcceleratorState`: MULTI_GPU,
      MULTI_XPU, ...): CPU processes (MULTI_CPU) silently get DDP, a full copy on every rank, with the FSDP
      arguments set. FSDP2 runs on CPU with gloo, so CPU processes get the state accelerate gives a GPU group: the
      FSDP type and the same plugin. From there on everything (fully_shard per layer, the optimizer moved onto the
      shards, Trainer's FSDP branches) is accelerate's and Trainer's own code, as on GPUs.
    """

    def create_accelerator_and_postprocess(self) -> None:
        if self.args.fsdp:
            self.args.fsdp_plugin_args["mixed_precision_policy"] = MixedPrecisionPolicy()
        super().create_accelerator_and_postprocess()
        if self.args.fsdp and not self.is_fsdp_enabled:
            state = self.accelerator.state
            state.distributed_type = DistributedType.FSDP
            state.fsdp_plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
            self.is_fsdp_enabled = True

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """Trainer leaves autocast to accelerate, which wraps the model's forward in it, except under FSDP2."""
        if self.is_fsdp_enabled:
            return self.accelerator.autocast()
        return super().autocast_smart_context_manager(cache_enabled)


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
    all-reduce (FSDP's reduce-scatter) waits for. The time anatomy and the `memory` report stay this rank's own;
    `memory["ranks"]` adds every rank's estimate, measurement and error, in rank order.
    """
    ranks = gather(result)
    memory = result.memory
    if len(ranks) > 1:
        memory = {**memory, "ranks": [{key: r.memory[key] for key in ("estimate", "measured", "error")} for r in ranks]}

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
        memory=memory,
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
