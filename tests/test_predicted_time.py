"""preview()'s `predicted`: the run's time before Run, from earlier runs of the same kind when there are some."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from demo_core import RunConfig, prepare, preview
from demo_core.training import duration
from demo_core.training.duration import slots_per_step

RUN = dict(model="tiny-llama", dataset="flan-like", samples=32, steps=10, batch_size=4,
           collators=("padded", "flatten"))


def _earlier_run(seconds_per_slot: float, **config) -> dict:
    """An earlier run's document as the history keeps it (its config as a run of `config` records it): 6 steps of
    1,000 slots each."""
    return {"config": prepare(RunConfig(**{**RUN, **config})).document_config(),
            "results": [{"step_times_s": [1000 * seconds_per_slot] * 6, "step_padded_slots": [1000] * 6,
                         "profiled_step": 2}]}


def test_preview_predicts_the_run_time_from_the_parameters_then_from_earlier_runs():
    prepared = prepare(RunConfig(**RUN))
    first = preview(prepared)["predicted"]
    assert first["basis"] == "parameters" and first["duration_s"] > 0
    assert set(first["step_s"]) == {"padded", "flatten"}
    assert first["step_s"]["flatten"] < first["step_s"]["padded"]  # packed: only the real tokens

    known = preview(prepared, earlier_runs=[_earlier_run(2e-4)])["predicted"]
    slots = slots_per_step(prepared)
    assert known["basis"] == "history"
    assert known["step_s"] == pytest.approx({name: n * 2e-4 for name, n in slots.items()})
    assert known["duration_s"] == pytest.approx(2 * known["setup_s"] + 10 * sum(known["step_s"].values()))
    assert known["long"] is (known["duration_s"] > known["long_after_s"])


@pytest.mark.parametrize("change", [dict(lora_rank=8), dict(lora_rank=8, gradient_checkpointing=False),
                                    dict(gradient_checkpointing=True), dict(optimizer="sgd"), dict(attention="sdpa")])
def test_a_run_is_predicted_only_from_runs_that_train_the_same_way(change):
    prepared = prepare(RunConfig(**RUN, **change))
    predicted = preview(prepared, earlier_runs=[_earlier_run(2e-4)])["predicted"]
    assert predicted["basis"] == "parameters"
    predicted = preview(prepared, earlier_runs=[_earlier_run(2e-4, **change)])["predicted"]
    assert predicted["basis"] == "history"


def test_a_document_saved_before_a_speed_setting_existed_counts_at_its_default():
    prepared = prepare(RunConfig(**RUN))
    old = _earlier_run(2e-4)
    for name in ("resolved_gradient_checkpointing", "qlora", "fsdp", "lora_targets"):
        del old["config"][name]
    old["config"]["gradient_checkpointing"] = False  # a bool before "auto" existed
    assert preview(prepared, earlier_runs=[old])["predicted"]["basis"] == "history"


def test_a_long_run_is_flagged_long():
    prepared = prepare(RunConfig(**{**RUN, "steps": 1000}))
    predicted = preview(prepared, earlier_runs=[_earlier_run(1e-3)])["predicted"]
    assert predicted["duration_s"] > predicted["long_after_s"] and predicted["long"] is True


def _on_a_gpu(monkeypatch, device_name: str):
    """The run as it would resolve on a CUDA card of `device_name` (the card is the boundary this machine lacks)."""
    prepared = prepare(RunConfig(**RUN))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: device_name)
    return dataclasses.replace(prepared, resolved=dataclasses.replace(prepared.resolved, device="cuda",
                                                                      precision="bf16"))


def test_on_a_gpu_the_table_knows_the_time_comes_from_the_step_time_model(monkeypatch):
    on_h100 = _on_a_gpu(monkeypatch, "NVIDIA H100 80GB HBM3")
    predicted = duration.predicted(on_h100)
    assert predicted["basis"] == "model"
    speedup = on_h100.predicted_speedups["flatten"]
    # the model's own step times: flatten's step is padded's over the model's speedup, not the slots' ratio
    assert predicted["step_s"]["padded"] / predicted["step_s"]["flatten"] == pytest.approx(speedup)
    slots = slots_per_step(on_h100)
    assert speedup != pytest.approx(slots["padded"] / slots["flatten"], rel=0.01)
    # an earlier run of the same kind on this machine still comes first
    earlier = {**_earlier_run(2e-4), "config": on_h100.document_config()}
    assert duration.predicted(on_h100, [earlier])["basis"] == "history"


def test_on_a_gpu_the_table_does_not_know_the_time_comes_from_the_parameter_count(monkeypatch):
    predicted = duration.predicted(_on_a_gpu(monkeypatch, "Some Future Accelerator 9000"))
    assert predicted["basis"] == "parameters"
