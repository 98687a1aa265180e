"""`plan --gpu-type`, a .txt length profile and `throughput` in the plan's document, the CLI's table and the page's
figure: the planner's "how fast?" (demo_core/throughput/planning.py)."""

from __future__ import annotations

import json

import pytest

from commandline.main import main
from demo_core import COLLATORS, GPUS, PlanRequest, RunConfig, preview
from demo_core.memory.plan_request import load_config
from demo_core.settings import by_name
from demo_core.throughput import predict_throughput
from presentation.report import forecast_rows
from presentation.speed_views import time_per_token_figure
from serving import planner_page

from figure_checks import PHONE_IN, cut_off, overlapping

SPREAD = [40, 900, 60, 75, 1200, 50, 300, 45] * 16  # short examples with a few long ones: padding costs
CONTRACT = {"tokens_per_s", "step_s", "speedup_vs_padded", "range"}


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, SPREAD)) + "\n\n")  # a trailing blank line is not an example
    return path


def plan_json(tmp_path, *args) -> dict:
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "Llama-3.2-1B", "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_plan_json_prices_every_collator_on_the_gpu_type_and_the_gpu_type_sets_the_size(tmp_path, profile, capsys):
    document = plan_json(tmp_path, "--gpu-type", "h200", "--dataset", str(profile), "--batch-size", "8",
                         "--seq-length", "2048", "--gradient-checkpointing")
    throughput = document["throughput"]
    assert throughput["gpu"] == "h200" and document["gpu_gb"] == 141 == document["request"]["gpu_gb"]
    collators = throughput["collators"]
    assert {"padded", "flatten", "bfd"} <= set(collators)
    for entry in collators.values():
        assert CONTRACT <= set(entry) and entry["tokens_per_s"] > 0 and entry["step_s"] > 0
        low, high = entry["range"]
        assert low <= entry["speedup_vs_padded"] <= high
    assert collators["padded"]["speedup_vs_padded"] == 1.0 == collators["padded"]["range"][0]
    # the profile's padding is what flatten saves: faster than padded, slower than if time were slots alone
    slots_ideal = sum(len(b) * max(b) for b in zip(*[iter(SPREAD)] * 8)) / sum(SPREAD)
    assert 1.2 < collators["flatten"]["speedup_vs_padded"] < slots_ideal
    printed = capsys.readouterr().out
    assert "how fast, predicted on H200" in printed and "flatten" in printed and "tokens/s" in printed
    # a .txt profile is in the model's tokens: no note about byte-level tokens
    assert not any("byte-level" in note for note in document["notes"])


def test_without_a_gpu_type_speed_is_priced_on_an_a100_and_the_size_is_gpu_gb(tmp_path):
    document = plan_json(tmp_path, "--gpu-gb", "24", "--batch-size", "2", "--seq-length", "512")
    assert document["throughput"]["gpu"] == "a100-80gb" and document["gpu_gb"] == 24
    # equal lengths: no padding to save, every layout computes the same slots
    assert document["throughput"]["collators"]["flatten"]["speedup_vs_padded"] == pytest.approx(1.0, abs=0.02)


def test_a_slower_card_trains_fewer_tokens_per_second(tmp_path, profile):
    speeds = {name: plan_json(tmp_path, "--gpu-type", name, "--dataset", str(profile), "--batch-size", "4")
              ["throughput"]["collators"]["flatten"]["tokens_per_s"] for name in ("h100-sxm", "l4")}
    assert speeds["h100-sxm"] > 3 * speeds["l4"]  # 989 vs 121 dense bf16 TFLOP/s, 3.35 vs 0.3 TB/s


@pytest.mark.parametrize("content, message", [
    ("120\n80\nabc\n", "line 3 of"),
    ("120\n-4\n", "line 2 of"),
    ("12.5\n", "line 1 of"),
    ("\n\n", "holds no lengths"),
])
def test_a_bad_length_profile_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "lengths.txt"
    path.write_text(content)
    assert main(["plan", "--model", "Llama-3.2-1B", "--dataset", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_an_unknown_gpu_type_is_one_line_and_exit_2(capsys):
    assert main(["plan", "--model", "Llama-3.2-1B", "--gpu-type", "a100-8gb"]) == 2
    assert "invalid choice: 'a100-8gb'" in capsys.readouterr().err


def test_gpu_type_is_declared_once_after_the_last_plan_position():
    item = by_name(PlanRequest)["gpu_type"]
    others = [setting.api for setting in by_name(PlanRequest).values() if setting.api is not None
              and setting.name != "gpu_type"]
    assert item.api == max(others) + 1  # /plan's positional order is a contract: a new setting comes last
    assert set(item.choice_values()) == set(GPUS) and item.page is not None
    assert PlanRequest(model="Llama-3.2-1B", gpu_type="l4", gpu_gb=80).validated().gpu_gb == 24


def test_the_api_returns_throughput_beside_the_memory_plan():
    document = planner_page.plan_api(model="SmolLM2-135M", batch_size=4, seq_length=512, dataset="flan-like",
                                     gpu_type="rtx-4090")
    assert document["throughput"]["gpu"] == "rtx-4090" and document["gpu_gb"] == 24
    assert CONTRACT <= set(document["throughput"]["collators"]["flatten"])


@pytest.mark.parametrize("width_in", [PHONE_IN, 6.5])
def test_the_speed_figure_keeps_its_text_apart_and_inside(width_in):
    throughput = predict_throughput(load_config("Llama-3.2-1B"), SPREAD, list(COLLATORS), 8, "a10g", lora_rank=16,
                                    qlora=True, gradient_checkpointing=True)
    figure = time_per_token_figure(throughput, 1, width_in)
    assert overlapping(figure) == [] and cut_off(figure) == []
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_yticklabels()] == list(throughput["collators"])
    # QLoRA's dequantization cannot shrink: drawn hatched, in every bar
    assert any(patch.get_hatch() == "//" for patch in axes.patches)


def test_the_preview_says_what_the_same_comparison_would_give_on_each_gpu():
    """/preview's `gpu_predictions` and the "Before training" table's row: the run's own batches on every GPU of the
    table. A tiny model keeps a fast card waiting on kernel launches, which packing cannot shrink: a slow card computes
    longer, so it trains fewer tokens/s and gains more from packing."""
    numbers = preview(RunConfig(model="tiny-llama", dataset="flan-like", samples=64, steps=4, batch_size=8,
                                collators=("padded", "flatten")))
    on_gpus = numbers["gpu_predictions"]
    assert set(on_gpus) == set(GPUS)
    for entry in on_gpus.values():
        assert set(entry["collators"]) == {"padded", "flatten"}
        assert entry["collators"]["padded"]["speedup_vs_padded"] == 1.0
        assert entry["collators"]["flatten"]["speedup_vs_padded"] >= 1.0  # the same examples, fewer slots
    fast, slow = on_gpus["h100-sxm"]["collators"], on_gpus["t4"]["collators"]
    assert slow["padded"]["tokens_per_s"] < fast["padded"]["tokens_per_s"]
    assert slow["flatten"]["speedup_vs_padded"] > fast["flatten"]["speedup_vs_padded"]
    row = next(line for line in forecast_rows(numbers).splitlines() if "on each GPU" in line)
    assert f"{on_gpus['t4']['label']} {slow['flatten']['speedup_vs_padded']:.2f}×" in row
