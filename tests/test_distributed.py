"""DDP and FSDP on CPU: two gloo processes under torchrun train on the single-process global batch and get its losses;
under FSDP each holds half the weights, gradients and optimizer state, as the planner predicts.

Each launch runs in its own process session with a timeout, so a hung rank fails the test instead of stalling CI,
and torchrun's per-rank logs (`--log-dir --redirects 3`) show what each rank printed on its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import LlamaForCausalLM

from demo_core import DemoInputError, RunConfig, prepare, run_comparison
from demo_core.training.trainers import training_arguments

REPO = Path(__file__).resolve().parents[1]
RUN = ["--model", "tiny-llama", "--samples", "32", "--collators", "padded,flatten", "--steps", "3", "--device", "cpu",
       "--precision", "fp32", "--seed", "0"]


def torchrun(args: list[str], log_dir: Path, timeout_s: float) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "--log-dir", str(log_dir), "--redirects", "3", "-m", "demo_core", "compare", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # a test session inside a launcher must not leak its own group into this one
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun and every rank it started
        process.communicate()
        pytest.fail(f"torchrun did not finish within {timeout_s:.0f} s: a rank hung")
    return subprocess.CompletedProcess(command, process.returncode, output)


def rank_logs(log_dir: Path, stream: str) -> list[str]:
    """What each rank wrote to `stream`, in rank order (torchrun: <log_dir>/<run>/attempt_0/<rank>/<stream>.log)."""
    paths = sorted(log_dir.glob(f"*/attempt_0/*/{stream}.log"), key=lambda path: int(path.parent.name))
    assert len(paths) == 2, paths
    return [path.read_text() for path in paths]


def one_process(optimizer: str) -> dict:
    config = RunConfig(model="tiny-llama", samples=32, collators=("padded", "flatten"), steps=3, batch_size=4,
                       device="cpu", precision="fp32", seed=0, optimizer=optimizer)
    return run_comparison(config).to_dict()


@pytest.fixture(scope="module")
def single_process() -> dict:
    return one_process("adamw")


def test_two_gloo_ranks_match_the_single_process_run(tmp_path, single_process):
    out = tmp_path / "out"
    out.mkdir()
    # Hugging Face's batch semantics: 2 processes of 2 each train the single process's batch of 4
    launch = torchrun([*RUN, "--batch-size", "2", "--json", str(out / "result.json")], tmp_path / "logs", 240)
    assert launch.returncode == 0, launch.stdout[-3000:]
    assert [path.name for path in out.iterdir()] == ["result.json"]  # rank 0 alone writes
    document = json.loads((out / "result.json").read_text())
    assert document["environment"]["world_size"] == 2
    assert document["config"]["effective_batch_size"] == 4 == single_process["config"]["effective_batch_size"]

    single = {result["collator"]: result for result in single_process["results"]}
    for result in document["results"]:
        reference = single[result["collator"]]
        assert result["world_size"] == 2 and result["effective_batch_size"] == 4
        assert len(result["losses"]) == 3
        # The group's step loss is the single-process loss of the same global batch.
        assert max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])) < 1e-4
        # The two ranks' shares of a step are together exactly the single-process step's examples...
        assert result["step_real_tokens"] == reference["step_real_tokens"]
        assert result["step_examples"] == reference["step_examples"] == [4, 4, 4]
        # ...and distinct: each rank trained on real tokens of its own, and the shares add up.
        shares = result["rank_step_real_tokens"]
        assert len(shares) == 2 and all(sum(share) > 0 for share in shares)
        assert [a + b for a, b in zip(*shares)] == result["step_real_tokens"]
        assert len(result["rank_peak_memory_bytes"]) == 2
        assert sum(result["tokens_per_s_per_device"]) == pytest.approx(result["tokens_per_s"])
        if result["collator"] == "flatten":  # no padding: the ranks' work adds up to the single process's
            assert result["step_work_flops"] == pytest.approx(reference["step_work_flops"])

    table, quiet = rank_logs(tmp_path / "logs", "stdout")
    assert "2 processes (DDP)" in table and "padded" in table
    assert quiet == ""


def test_fsdp_over_two_gloo_ranks_matches_one_process_with_half_the_states_on_each(tmp_path):
    # SGD, not AdamW: AdamW's update hardly changes when every gradient is off by the same factor, SGD's does.
    single_process = one_process("sgd")
    out = tmp_path / "result.json"
    launch = torchrun([*RUN, "--batch-size", "2", "--optimizer", "sgd", "--fsdp", "--json", str(out)],
                      tmp_path / "logs", 240)
    assert launch.returncode == 0, launch.stdout[-3000:]
    document = json.loads(out.read_text())
    assert document["config"]["fsdp"] is True and document["environment"]["world_size"] == 2

    single = {result["collator"]: result for result in single_process["results"]}
    results = {result["collator"]: result for result in document["results"]}
    for name, result in results.items():
        reference = single[name]
        # The same global batches, and the same losses as one process, padded and packed alike.
        assert result["step_real_tokens"] == reference["step_real_tokens"]
        assert max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])) < 1e-4
        assert result["memory"]["shard"] == "fsdp"
        assert len(result["memory"]["ranks"]) == 2
        for rank in result["memory"]["ranks"]:
            for category in ("weights", "gradients", "optimizer"):
                # Each rank holds half of what one process holds (its local shards, summed)...
                assert rank["measured"][category] == pytest.approx(reference["memory"]["measured"][category] / 2,
                                                                   rel=0.01), (name, category)
                # ...and the planner's FSDP estimate for 2 GPUs says so.
                assert abs(rank["error"][category]) < 0.05, (name, category, rank)
            # Activations are each rank's own, not sharded: FSDP's gathered weights are not counted among them.
            assert abs(rank["error"]["activations"]) < 0.05, (name, rank)
    assert max(abs(a - b) for a, b in zip(results["flatten"]["losses"], results["padded"]["losses"])) < 1e-4

    table, quiet = rank_logs(tmp_path / "logs", "stdout")
    assert "2 processes (FSDP" in table and "plan --gpus 2 --shard fsdp" in table
    assert quiet == ""


def test_fsdp_is_refused_where_it_cannot_shard(monkeypatch):
    with pytest.raises(DemoInputError, match="over several processes"):
        run_comparison(RunConfig(fsdp=True, device="cpu"))  # one process: nothing to shard over
    monkeypatch.setenv("WORLD_SIZE", "2")
    # A model with no decoder layer class to group by would be gathered whole.
    monkeypatch.setattr(LlamaForCausalLM, "_no_split_modules", None)
    with pytest.raises(DemoInputError, match="LlamaForCausalLM names no decoder layer class"):
        run_comparison(RunConfig(fsdp=True, device="cpu", model="tiny-llama"))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # accelerate launch --use_fsdp without --fsdp
    with pytest.raises(DemoInputError, match="pass --fsdp"):
        run_comparison(RunConfig(device="cpu"))
    with pytest.raises(DemoInputError, match="fsdp must be true or false"):
        RunConfig(fsdp="yes").validated()


def test_bad_argument_fails_on_every_rank_alike(tmp_path):
    launch = torchrun([*RUN, "--max-length", "99999"], tmp_path / "logs", 120)
    assert launch.returncode != 0
    assert "exitcode  : 2" in launch.stdout  # torchrun's summary names the rank that failed first
    errors = rank_logs(tmp_path / "logs", "stderr")
    assert errors[0] == errors[1]
    assert errors[0].startswith("error: max length must be between") and errors[0].count("\n") == 1


def test_batch_size_is_each_processes_micro_batch(monkeypatch):
    # As every Hugging Face trainer: a step trains batch size x accumulation x processes examples.
    monkeypatch.setenv("WORLD_SIZE", "4")
    prepared = prepare(RunConfig(samples=64, batch_size=3, grad_accum=2, collators=("padded",)))
    assert prepared.config.batch_size == 3 and prepared.effective_batch_size == 24
    assert prepared.document_config()["effective_batch_size"] == 24
    assert training_arguments(prepared.resolved, "unused")["per_device_train_batch_size"] == 3
