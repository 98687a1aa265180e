"""The "Will it fit?" section: handlers and figures without a server (the /plan endpoint is in test_app_api)."""

from __future__ import annotations

import threading

import gradio as gr
import pytest

from demo_core import plan
from demo_core.caches import LRU
from demo_core.errors import DemoInputError
from demo_core.memory import probe as activation_probe
from presentation.batch_picture import BATCH_MAX_IN
from serving import planner_page
from serving.errors import user_errors
from serving.in_flight import REQUESTS
from serving.page import Screen

from figure_checks import cut_off, overlapping

GIB = 2 ** 30
QLORA_8B = dict(model="Llama-3.1-8B", batch_size=4, seq_length=2048, dataset="flan-like", packed=True,
                precision="bf16", optimizer="adamw", lora_rank=16, qlora=True, gradient_checkpointing=True, gpus=1,
                shard="none", gpu_gb=80)


def test_page_plan_draws_padded_and_packed_peaks_with_gpu_lines():
    views = planner_page.plan_page(**QLORA_8B)
    summary, bars, curve = views.summary, views.bars, views.curve
    assert "Peak per device" in summary and "24 GB: fits" in summary  # in words, not a mark alone
    axes = bars.axes[0]
    # one stacked segment per category and bar; each bar's stack adds up to its plan's peak
    tops = {}
    for patch in axes.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0), patch.get_y() + patch.get_height())
    padded = plan(planner_page._request(**{**QLORA_8B, "packed": False}))
    packed = plan(planner_page._request(**QLORA_8B))
    assert tops[0] == pytest.approx(padded.device.peak_bytes / GIB)
    assert tops[1] == pytest.approx(packed.device.peak_bytes / GIB)  # the bars are the plans' own peaks
    assert tops[1] < tops[0]  # flan-like lengths: packing drops the padding
    gpu_lines = sorted(line.get_ydata()[0] for line in axes.lines)
    assert gpu_lines and set(gpu_lines) <= {24, 40, 80, 141}
    curves = {line.get_label(): line.get_ydata() for line in curve.axes[0].lines}
    assert len(curves["padded"]) == len(curves["packed (padding-free)"]) == len(packed.scaling)
    assert all(p <= q for p, q in zip(curves["packed (padding-free)"], curves["padded"]))


def test_api_returns_the_plan_document():
    document = planner_page.plan_api(model="SmolLM2-135M", batch_size=4, seq_length=512)
    assert {"per_device", "total_bytes", "peak_moment", "fits", "max_batch_size", "max_seq_length"} <= set(document)
    assert document["fits"]["24"] is True


def test_the_page_as_it_opens_and_plan_give_the_same_answer_for_a_lora_question():
    # Llama-3.1-8B, LoRA r16, 4 x 2048 on 24 GB, everything else as the page opens: checkpointing is "auto" there as
    # in /plan (on for LoRA), so both plan with it (issue 30: the page said 67.1 GiB, does not fit; /plan 19.3 GiB).
    question = {"model": "Llama-3.1-8B", "lora_rank": 16, "batch_size": 4, "seq_length": 2048, "gpu_gb": 24}
    assert planner_page.PAGE_DEFAULTS["gradient_checkpointing"] is None
    asked = {**planner_page.PAGE_DEFAULTS, **question}
    answer, summary = planner_page.plan_api(**asked), planner_page.plan_page(**asked).summary
    assert answer["fits"]["24"] is True and "24 GB: fits" in summary
    assert f"**{answer['device_used_bytes'] / GIB:.1f} GiB used on the card**" in summary


@pytest.mark.parametrize("change, message", [
    ({"dataset": "my-private.jsonl"}, "built-in length profile"),
    ({"model": "."}, "local folder"),
    ({"gpus": 0}, "gpus must be at least 1"),
])
def test_page_reads_no_local_files_and_names_bad_values(change, message):
    with pytest.raises(DemoInputError, match=message):
        planner_page.plan_api(**{"model": "SmolLM2-135M", **change})


def test_section_builds_inside_blocks_and_registers_plan():
    with gr.Blocks() as demo:
        planner_page.build_planner_section(demo, gr.Number(visible=False))
    endpoint = demo.get_api_info()["named_endpoints"]["/plan"]
    assert list(demo.get_api_info()["named_endpoints"]) == ["/plan"]
    # named, described parameters (not "1st Api component"), in the documented order
    assert [parameter["parameter_name"] for parameter in endpoint["parameters"]][:3] == ["model", "batch_size",
                                                                                          "seq_length"]
    assert all(parameter["label"] == parameter["parameter_name"] for parameter in endpoint["parameters"])


def test_the_server_plans_the_opening_question_for_every_model_chip_before_anyone_asks(monkeypatch):
    # As a fresh server: no model probed yet, in a cache as large as the server's (so the warm-up must fit in it).
    monkeypatch.setattr(activation_probe, "_FIT_CACHE", LRU(activation_probe._FIT_CACHE.max_entries))
    planner_page.warm_up_in_background(scope="opening").join(timeout=600)
    probed_after_warm_up = []
    monkeypatch.setattr(activation_probe, "_fit", lambda *args: probed_after_warm_up.append(args))
    for model in planner_page.shipped_configs():  # the chips under the model box
        summary = planner_page.plan_page(**{**planner_page.PAGE_DEFAULTS, "model": model}).summary
        assert "Peak per device" in summary
    assert probed_after_warm_up == []  # every probe they need was fitted ahead


# The smallest chip: its LoRA fits are the quickest (the warm-up of every chip's takes minutes, benchmarks/).
SMALL_CHIP = "SmolLM2-135M"
LORA_R16 = {"model": SMALL_CHIP, "lora_rank": 16, "qlora": False, "batch_size": 4, "seq_length": 2048, "gpu_gb": 24}


def test_the_lora_phase_answers_a_chips_lora_question_ahead(monkeypatch):
    monkeypatch.setattr(activation_probe, "_FIT_CACHE", LRU(activation_probe._FIT_CACHE.max_entries))
    fitted_ahead = []
    lora = [question for question in planner_page.lora_questions([SMALL_CHIP]) if not question["qlora"]]
    planner_page.warm_up(lora, before_each_fit=lambda: fitted_ahead.append(True))
    assert fitted_ahead  # the warm-up computed the fits (none were cached), each after its hook
    probed_after_warm_up = []
    monkeypatch.setattr(activation_probe, "_fit", lambda *args: probed_after_warm_up.append(args))
    # The question (issue 30: 10-13 s the first time), on the page and through /plan.
    assert "Peak per device" in planner_page.plan_page(**{**planner_page.PAGE_DEFAULTS, **LORA_R16}).summary
    assert planner_page.plan_api(**LORA_R16)["request"]["gradient_checkpointing"] is True
    assert probed_after_warm_up == []  # answered from the fit cache


def test_the_lora_phase_waits_while_a_request_is_served(monkeypatch):
    monkeypatch.setattr(activation_probe, "_FIT_CACHE", LRU(activation_probe._FIT_CACHE.max_entries))
    fits, fit = [], activation_probe._fit

    def counted_fit(config, spec):
        fits.append(spec)
        return fit(config, spec)

    monkeypatch.setattr(activation_probe, "_fit", counted_fit)

    @user_errors
    def streaming_handler():  # as a run on the page: in flight from its first update to its last
        yield "first update"
        yield "last update"

    stream = streaming_handler()
    next(stream)
    questions = planner_page.lora_questions([SMALL_CHIP])[:1]
    warming = threading.Thread(target=planner_page.warm_up, args=(questions, REQUESTS.wait_until_idle), daemon=True)
    warming.start()
    while REQUESTS.waiting == 0 and warming.is_alive():  # until it waits, or (the wait broken) it has planned
        warming.join(timeout=0.05)
    assert REQUESTS.waiting == 1 and fits == []  # it stopped before its first fit
    assert list(stream) == ["last update"]  # the run ends: nothing is served any more
    warming.join(timeout=600)
    assert not warming.is_alive() and fits  # and then it planned


def test_the_warm_up_scope_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(planner_page.WARM_UP_ENV, raising=False)
    assert planner_page.warm_up_scope() == "all"  # a Space plans everything ahead
    monkeypatch.setenv(planner_page.WARM_UP_ENV, " Opening ")
    assert planner_page.warm_up_scope() == "opening"
    monkeypatch.setenv(planner_page.WARM_UP_ENV, "some")
    with pytest.raises(DemoInputError, match="PACKING_LAB_PLANNER_WARMUP must be one of all, opening, off, got 'some'"):
        planner_page.warm_up_scope()
    monkeypatch.setenv(planner_page.WARM_UP_ENV, "off")
    monkeypatch.setattr(activation_probe, "_FIT_CACHE", LRU(activation_probe._FIT_CACHE.max_entries))
    planner_page.warm_up_in_background().join(timeout=60)
    assert len(activation_probe._FIT_CACHE) == 0  # "off" plans nothing


@pytest.mark.parametrize("picture_px", [326, 1065])  # a phone's width, a desktop's (the figures cap at 6.5 in)
def test_the_figures_are_drawn_for_the_width_the_page_shows_them_at(picture_px):
    # Drawn wider than shown, the browser shrinks them and their text with them (to 63% on a phone at 6.5 in).
    views = planner_page.plan_page(**QLORA_8B, screen=Screen(picture_px))
    # The memory figures share a row (each capped at 6.5 in); the speed figure spans the column under them.
    for figure, widest_in in ((views.bars, 6.5), (views.curve, 6.5), (views.speed, BATCH_MAX_IN)):
        assert figure.get_size_inches()[0] * figure.dpi == pytest.approx(min(picture_px, widest_in * figure.dpi))
        assert cut_off(figure) == []  # and every text stays inside at that width
        assert overlapping(figure) == []  # and apart: the bars' labels share a phone's width
