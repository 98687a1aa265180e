"""Faults during a run: GPU out-of-memory (injected at the burst boundary: there is no GPU here) and Stop."""

import threading

import pytest
import torch

import demo_core.training.engine as engine
from demo_core import DemoInputError, RunConfig, run_comparison

SMALL = dict(model="tiny-llama", dataset="flan-like", samples=32, batch_size=4, attention="sdpa")


def test_out_of_memory_becomes_a_message_and_the_next_run_works(monkeypatch):
    real_run_burst = engine.run_burst
    calls = []

    def run_burst_that_runs_out_of_memory_once(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_run_burst(*args, **kwargs)

    monkeypatch.setattr(engine, "run_burst", run_burst_that_runs_out_of_memory_once)
    config = RunConfig(**SMALL, collators=("padded", "flatten"), steps=2)
    with pytest.raises(DemoInputError, match="out of GPU memory while training 'padded'.*smaller batch size"):
        run_comparison(config)
    document = run_comparison(config).to_dict()
    assert [r["collator"] for r in document["results"]] == ["padded", "flatten"]
    assert not document["partial"]


def test_stop_ends_the_burst_within_a_step_and_labels_it_partial():
    stop = threading.Event()

    def stop_after_two_steps(collator, step, total):
        if step == 2:
            stop.set()

    config = RunConfig(**SMALL, collators=("padded", "flatten"), steps=30)
    comparison = run_comparison(config, progress=stop_after_two_steps, stop_event=stop)
    assert comparison.partial
    # On a CPU the collators take turns step by step: padded's step 2 sets Stop while flatten waits for its turn after
    # its step 1; it stops as the turn comes back, without another step.
    assert [r.collator for r in comparison.results] == ["padded", "flatten"]
    assert [(r.partial, r.steps) for r in comparison.results] == [(True, 2), (True, 1)]
    assert comparison.contamination == []  # skipped: Stop ends the run without the extra forward passes
    # The next run is unaffected.
    again = run_comparison(RunConfig(**SMALL, collators=("flatten",), steps=3))
    assert not again.partial and again.results[0].steps == 3


def test_a_failing_burst_stops_the_others_at_their_next_step_and_the_next_run_works():
    steps_seen = []

    def fail_in_padded_step_2(collator, step, total):
        steps_seen.append((collator, step))
        if (collator, step) == ("padded", 2):  # inside the profiled window, which closes after this callback
            raise RuntimeError("injected failure")

    config = RunConfig(**SMALL, collators=("padded", "flatten"), steps=30)
    with pytest.raises(RuntimeError, match="injected failure"):
        run_comparison(config, progress=fail_in_padded_step_2)
    # flatten was waiting for its turn after step 1: it stops there instead of training 29 more steps alone.
    assert steps_seen == [("padded", 1), ("flatten", 1), ("padded", 2)]
    again = run_comparison(RunConfig(**SMALL, collators=("flatten",), steps=3))
    assert again.results[0].time_anatomy is not None
