"""A run's numbers never depend on what else the process is doing (demo_core/isolation.py).

A server runs other work beside a run: the planner's activation probes (its start-up warm-up, any visitor's `/plan`)
and meta-device builds (in a config's own dtype), pre-flight checks and model builds for previews, contamination
checks, and changes of intra-op threads. Every one of them used to seed, draw from or restore torch's process-wide
generator, or set its default dtype, from its own thread, and a run drew its initial weights (and dropout masks)
from that same generator and made tensors in that default dtype. Here those neighbours run in threads, as hard as they
can, while a run trains; its losses must equal a quiet run's bit for bit.
"""

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from gradio_client import Client
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig

from demo_core import RunConfig, run_comparison
from demo_core.attention.contamination import contamination_check
from demo_core.attention.preflight import measure_packing
from demo_core.isolation import exclusive
from demo_core.memory import probe as activation_probe
from demo_core.memory.parameters import param_facts
from demo_core.memory.probe import activation_fit
from demo_core.memory.probe_model import ProbeSpec
from demo_core.models.sources import byte_tokenizer, load_model_source

RUN = dict(dataset="flan-like", samples=16, collators=("padded", "flatten"), steps=3, batch_size=4, seed=1,
           max_length=256)
REPO = Path(__file__).resolve().parent.parent
_ranks = itertools.count(1)  # a LoRA rank never asked before: the planner's fit cache cannot answer it


def _neighbour_work(stop: threading.Event, done: list) -> None:
    """One of each kind of work a server does beside a run, over and over."""
    source = load_model_source("tiny-qwen2")
    examples = [[5, 6, 7, 8, 9], [10, 11, 12]]
    while not stop.is_set():
        # The planner counts a real model's parameters on the meta device, in its config's dtype (often fp16).
        param_facts(LlamaConfig(vocab_size=1000 + next(_ranks), hidden_size=64, intermediate_size=128,
                                num_hidden_layers=2, num_attention_heads=4, dtype="float16"))
        activation_fit(source.config, ProbeSpec("packed", True, "fp32", "sdpa", False, lora_rank=next(_ranks)))
        measure_packing(source, "sdpa", "cpu", ("packed", "padded"), seed=next(_ranks))
        source.build("eager", seed=next(_ranks))
        contamination_check(source, "sdpa", examples, "cpu", seed=next(_ranks))
        torch.set_num_threads(2)
        done.append(1)


@contextlib.contextmanager
def busy_neighbours(count: int = 2):
    stop, done = threading.Event(), []
    threads = [threading.Thread(target=_neighbour_work, args=(stop, done), daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield done
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _losses(config: RunConfig) -> list[list[float]]:
    return [result.losses for result in run_comparison(config).results]


@pytest.fixture(scope="module")
def cli_losses(tmp_path_factory) -> list[list[float]]:
    """The tiny-llama run of RUN as `python -m demo_core compare --json` gives it, in a process of its own."""
    path = tmp_path_factory.mktemp("cli") / "run.json"
    arguments = ["--model", "tiny-llama", "--dataset", RUN["dataset"], "--samples", str(RUN["samples"]),
                 "--collators", ",".join(RUN["collators"]), "--steps", str(RUN["steps"]),
                 "--batch-size", str(RUN["batch_size"]), "--seed", str(RUN["seed"]),
                 "--max-length", str(RUN["max_length"]), "--json", str(path)]
    subprocess.run([sys.executable, "-m", "demo_core", "compare", *arguments], cwd=REPO, check=True,
                   capture_output=True, timeout=300)
    return [result["losses"] for result in json.loads(path.read_text())["results"]]


def test_a_run_beside_probes_preflight_checks_and_model_builds_gives_the_clis_losses(cli_losses):
    config = RunConfig(model="tiny-llama", **RUN)
    assert _losses(config) == cli_losses
    with busy_neighbours() as done:
        busy = _losses(config)
    assert done, "the neighbours never finished a round while the run trained"
    assert busy == cli_losses


def test_compare_at_start_up_beside_other_visitors_gives_the_clis_losses(lab_app, cli_losses, monkeypatch):
    """The server as it has just started (nothing fitted, the planner's warm-up running) while other visitors ask
    `/plan` new questions (LoRA ranks nobody asked, so probes run), `/preview` other models and `/history`."""
    from serving import planner_page

    monkeypatch.setattr(activation_probe, "_FIT_CACHE", {})
    monkeypatch.setattr(planner_page, "shipped_configs", dict)  # the warm-up plans the default model only: shorter
    # Its opening questions only: the LoRA phase waits while a request is served, so it would fit nothing beside the
    # run and only lengthen the test.
    warm_up = planner_page.warm_up_in_background(scope="opening")
    runner, visitor = (Client(lab_app.demo.local_url, verbose=False) for _ in range(2))
    job = runner.submit(model="tiny-llama", dataset=RUN["dataset"], samples=RUN["samples"],
                        collators=",".join(RUN["collators"]), steps=RUN["steps"], batch_size=RUN["batch_size"],
                        seed=RUN["seed"], max_length=RUN["max_length"], api_name="/compare")
    asked = []
    while not job.done():
        rank = next(_ranks)
        visitor.predict(model="tiny-llama", batch_size=2, seq_length=128, lora_rank=rank, api_name="/plan")
        visitor.predict(model=("tiny-qwen2", "tiny-mistral")[rank % 2], samples=8, seed=rank, steps=3, batch_size=4,
                        max_length=128, api_name="/preview")
        visitor.predict(api_name="/history")
        asked.append(rank)
    document = job.result(timeout=300)
    warm_up.join(timeout=300)
    assert asked, "no other visitor's request ran while the run trained"
    assert [result["losses"] for result in document["results"]] == cli_losses


@pytest.fixture(scope="module")
def gpt2_with_dropout(tmp_path_factory):
    """A hub-style GPT-2 (dropout 0.1 everywhere, as gpt2's config.json has it) saved as a local model folder: every
    training step draws dropout masks from torch's generator."""
    folder = tmp_path_factory.mktemp("gpt2-dropout")
    tokenizer = byte_tokenizer()
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=512, pad_token_id=0,
                        bos_token_id=None, eos_token_id=1, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_model_with_dropout_draws_the_same_masks_beside_other_work(gpt2_with_dropout):
    config = RunConfig(model=gpt2_with_dropout, attention="sdpa", **RUN)
    quiet = _losses(config)
    with busy_neighbours():
        busy = _losses(config)
    assert busy == quiet
    again = _losses(config)
    assert again == quiet


def test_a_worker_forked_while_another_thread_holds_the_state_can_take_it():
    """ZeroGPU forks the server to train: a probe that holds the process state in another thread at that moment (in
    the middle of a half-precision build) must leave the child neither waiting forever nor in its dtype."""
    held, release = threading.Event(), threading.Event()

    def probe() -> None:
        with exclusive(seed=3):
            torch.set_default_dtype(torch.float16)  # as transformers does while it builds a half-precision model
            held.set()
            release.wait()

    thread = threading.Thread(target=probe)
    thread.start()
    held.wait()
    try:
        child = os.fork()
        if child == 0:  # the worker: only this thread exists here
            # a lock still held would wait forever: SIGALRM's default action ends the child with a failure instead
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(20)
            with exclusive(seed=0):
                ok = torch.get_default_dtype() == torch.float32
            os._exit(0 if ok else 1)
        _, status = os.waitpid(child, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0
    assert torch.get_default_dtype() == torch.float32  # the probe left the parent's state as it found it
