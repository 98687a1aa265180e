"""A run's numbers never depend on what else the process is doing (demo_core/isolation.py).

A server runs other work beside a run: the planner's activation probes (its start-up warm-up, any visitor's `/plan`),
pre-flight checks and model builds for previews, contamination checks, and changes of intra-op threads. Every one
of them used to seed, draw from or restore torch's process-wide generator from its own thread, and a run drew its
initial weights (and dropout masks) from that same generator. Here those neighbours run in threads, as hard as they
can, while a run trains; its losses must equal a quiet run's bit for bit.
"""

import contextlib
import itertools
import threading

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from demo_core import RunConfig, run_comparison
from demo_core.activation_probe import ProbeSpec, activation_fit
from demo_core.contamination import contamination_check
from demo_core.models import byte_tokenizer, load_model_source
from demo_core.preflight import measure_packing

RUN = dict(dataset="flan-like", samples=16, collators=("padded", "flatten"), steps=3, batch_size=4, seed=1,
           max_length=256)
_ranks = itertools.count(1)  # a LoRA rank never asked before: the planner's fit cache cannot answer it


def _neighbour_work(stop: threading.Event, done: list) -> None:
    """One of each kind of work a server does beside a run, over and over."""
    source = load_model_source("tiny-qwen2")
    examples = [[5, 6, 7, 8, 9], [10, 11, 12]]
    while not stop.is_set():
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


def test_a_run_beside_probes_preflight_checks_and_model_builds_gives_the_quiet_runs_losses():
    config = RunConfig(model="tiny-llama", **RUN)
    quiet = _losses(config)
    with busy_neighbours() as done:
        busy = _losses(config)
    assert done, "the neighbours never finished a round while the run trained"
    assert busy == quiet


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
