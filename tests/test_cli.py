"""The CLI contract: flags, the JSON document's keys, and one-line errors with exit 2."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from commandline.main import main

RESULT_KEYS = {"collator", "attention", "steps", "real_tokens", "trained_tokens", "padded_slots", "pad_fraction",
               "tokens_per_s",
               "samples_per_s", "step_time_median_s", "losses", "peak_memory_bytes", "memory",
               "timed_steps", "tokens_per_s_range", "profiled_step", "time_anatomy", "code", "effective_batch_size"}
COMPARISON_KEYS = {"speedup_vs_padded", "ideal_speedup", "max_abs_loss_diff_vs_padded",
                   "work_ideal_speedup", "speedup_range", "flags"}


def run_cli(*args, timeout=240):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "demo_core", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_compare_writes_every_contract_key(tmp_path):
    out = tmp_path / "run.json"
    done = run_cli("compare", "--model", "tiny-llama", "--dataset", "flan-like", "--samples", "64", "--collators",
                   "padded,flatten", "--steps", "3", "--batch-size", "4", "--seed", "1", "--json", str(out),
                   "--report", str(tmp_path / "run.html"))
    assert done.returncode == 0, done.stderr
    # The report: one HTML file with its figures inside, and the same as Markdown with its PNGs beside it.
    page = (tmp_path / "run.html").read_text()
    assert page.count('<img src="data:image/png;base64,') >= 3 and "train_flatten.py" in page
    with zipfile.ZipFile(tmp_path / "run-markdown.zip") as archive:
        assert "report.md" in archive.namelist() and any(name.endswith(".png") for name in archive.namelist())
    document = json.loads(out.read_text())
    assert {"config", "dataset_stats", "results", "comparison"} <= set(document)
    assert [r["collator"] for r in document["results"]] == ["padded", "flatten"]
    for result in document["results"]:
        assert RESULT_KEYS <= set(result)
        assert result["effective_batch_size"] == 4 and "Trainer(" in result["code"]
        assert len(result["losses"]) == result["steps"] == 3
    for collator in ("padded", "flatten"):
        assert COMPARISON_KEYS <= set(document["comparison"][collator])
    assert "flatten" in done.stdout and "tokens/s" in done.stdout
    assert {"text", "loss_text"} <= set(document["dataset_stats"]["examples"][0])
    assert document["config"]["resolved_loss_on"] == "all" and "⟦" in done.stdout  # the trained part, marked
    # the step-time model's prediction for this run on this CPU, beside the measured speedup
    predicted = {r["collator"]: r["predicted_speedup_vs_padded"] for r in document["results"]}
    assert predicted["padded"] == 1.0 and predicted["flatten"] > 1.0  # flan-like: padding to save
    assert all(document["comparison"][name]["predicted_speedup_vs_padded"] == predicted[name] for name in predicted)
    assert f"predicted {predicted['flatten']:.2f}×, not measured" in done.stdout
    # 3 steps: one timed step, so no speedup, and the report says why in words.
    assert document["comparison"]["flatten"]["speedup_vs_padded"] is None
    assert document["comparison"]["flatten"]["flags"] == ["few-timed-steps"]
    assert "fewer than 3 timed steps" in done.stdout and "time anatomy" in done.stdout
    assert "ERROR" not in done.stderr and "USDT" not in done.stderr  # the profiler's own lines stay quiet


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "steps must be between"),
    (["--batch-size", "zero"], "batch size must be a whole number"),
    (["--collators", "padded,shuffle"], "unknown collator 'shuffle'"),
    (["--attention", "flash_attention_2"], "flash_attention_2 needs a CUDA GPU"),
    (["--dataset", "missing.jsonl"], "does not exist"),
    (["--max-length", "1"], "max length must be between"),
    (["--threads", "0"], "threads must be between 1 and"),
    (["--loss-on", "assistant"], "loss on 'assistant' needs conversations"),
    (["--loss-on", "prompt"], "invalid choice: 'prompt'"),
    (["--grad-accum", "0"], "grad accum must be between 1 and 256, got 0"),
    (["--unknown-flag"], "unrecognized arguments"),
    (["--report", "no-such-folder/run.html"], "--report no-such-folder/run.html: the folder no-such-folder does not"),
    (["--json", "."], "--json . is a folder: give a file name"),
    (["--emit-code", __file__], "is a file: give a folder"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    # In-process: the same main() the module entry point calls, without paying the imports once per case.
    assert main(["compare", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_bad_input_from_the_real_entry_point_has_no_traceback():
    done = run_cli("compare", "--samples", "-1", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: samples must be between 1 and 20000, got -1"


def test_capabilities_table_lists_every_path(capsys):
    assert main(["capabilities", "--models", "tiny-llama,tiny-gpt2"]) == 0
    table = capsys.readouterr().out
    for path in ("flash_attention_2", "varlen", "sdpa", "eager"):
        assert path in table


def test_training_needs_no_plotting_library(tmp_path):
    # A GPU box carries only what training needs (docs/GPU_OFFLINE.md: matplotlib travels with the app's set): the
    # CLI's comparison runs with matplotlib unimportable.
    script = ("import sys; sys.modules['matplotlib'] = None\n"
              "from commandline.main import main\n"
              "arguments = ['compare', '--samples', '16', '--steps', '3', '--batch-size', '4', '--json', sys.argv[1]]\n"
              "sys.exit(main(arguments))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run.json")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "run.json").read_text())["results"]
