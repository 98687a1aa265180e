"""The run as code, proven to be the run: `compare --emit-code DIR` writes a script per collator that a fine-tuner
would write (transformers' Trainer and DataCollatorWithFlattening, TRL's SFTTrainer / SFTConfig, peft's LoraConfig)
and the files it reads; run offline in a fresh Python without Packing Lab on its path, each trains its burst's steps
and prints its per-step losses, which equal the burst's within 1e-4.

Four cases of the issue's matrix (loss on all / completion / assistant, LoRA off and on, accumulation 1 and 2), every
collator in each, on tiny-llama with a few steps and examples; benchmarks/recipe_parity.py runs all twelve. The
scripts of a case run one after another in one fresh interpreter (the imports are most of a script's time);
`python DIR/train_<collator>.py` itself runs once, as the contract says.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_sft import CONVERSATION_RECORDS, PROMPT_COMPLETION_RECORDS

from commandline.main import main
from demo_core import COLLATORS

TOLERANCE = 1e-4  # the issue's: the Trainer logs 4 decimals (its log_history keeps the float: <1e-6 when measured)
ALL_CASES = [(loss_on, rank, accumulation) for loss_on in ("all", "completion", "assistant") for rank in (0, 4)
             for accumulation in (1, 2)]
CASES = [("all", 0, 1), ("completion", 4, 2), ("assistant", 0, 2), ("assistant", 4, 1)]
DATA = {  # loss on -> the records trained: built-in text, chat prompt/completion, conversations with tool calls
    "completion": PROMPT_COMPLETION_RECORDS,
    "assistant": CONVERSATION_RECORDS,
}
# Every script of a case in one fresh interpreter: each run as `python script.py` runs it, its standard output apart.
RUNNER = """
import contextlib, io, json, runpy, sys
losses = {}
for path in sys.argv[1:]:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        runpy.run_path(path, run_name="__main__")
    losses[path] = json.loads(output.getvalue().strip().splitlines()[-1])
print(json.dumps(losses))
"""


def offline_env() -> dict:
    """No hub, and no Packing Lab: the scripts import only the libraries a fine-tuner has."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    return env


def compare_with_code(folder: Path, loss_on: str, lora_rank: int, grad_accum: int, collators: list[str],
                      steps: int = 3) -> dict:
    """`compare ... --emit-code folder --json folder/run.json` in this process; the document."""
    folder.mkdir(parents=True, exist_ok=True)
    dataset = "flan-like"
    if loss_on in DATA:
        dataset = str(folder.parent / f"{loss_on}.jsonl")
        Path(dataset).write_text("\n".join(json.dumps(row) for row in DATA[loss_on] * 3))
    arguments = ["compare", "--model", "tiny-llama", "--dataset", dataset, "--samples", "12", "--steps", str(steps),
                 "--batch-size", "2", "--grad-accum", str(grad_accum), "--loss-on", loss_on, "--lora-rank",
                 str(lora_rank), "--max-length", "256", "--collators", ",".join(collators), "--device", "cpu",
                 "--emit-code", str(folder), "--json", str(folder / "run.json")]
    with contextlib.redirect_stdout(io.StringIO()):  # the report it prints: the JSON says the same
        assert main(arguments) == 0
    return json.loads((folder / "run.json").read_text())


def script_losses(folder: Path, names: list[str]) -> dict[str, list[float]]:
    paths = [str(folder / f"train_{name}.py") for name in names]
    done = subprocess.run([sys.executable, "-c", RUNNER, *paths], capture_output=True, text=True, env=offline_env(),
                          cwd=tempfile.gettempdir(), timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    by_path = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: by_path[path] for name, path in zip(names, paths)}


@pytest.fixture(scope="module")
def first_case(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("recipe") / "all-0-1"
    return folder, compare_with_code(folder, *CASES[0], list(COLLATORS))


@pytest.mark.parametrize("loss_on, lora_rank, grad_accum", CASES)
def test_every_emitted_script_trains_its_bursts_losses(tmp_path, first_case, loss_on, lora_rank, grad_accum):
    if (loss_on, lora_rank, grad_accum) == CASES[0]:
        folder, document = first_case
    else:
        folder = tmp_path / f"{loss_on}-{lora_rank}-{grad_accum}"
        document = compare_with_code(folder, loss_on, lora_rank, grad_accum, list(COLLATORS))
    config = document["config"]
    assert (config["resolved_loss_on"], config["lora_rank"], config["grad_accum"]) == (loss_on, lora_rank, grad_accum)
    names = [result["collator"] for result in document["results"]]
    assert names == list(COLLATORS)
    for result in document["results"]:  # what the JSON carries is what was written
        assert (folder / f"train_{result['collator']}.py").read_text() == result["code"]
        assert "import demo_core" not in result["code"] and "from demo_core" not in result["code"]
        assert result["effective_batch_size"] == 2 * grad_accum
    losses = script_losses(folder, names)
    differences = {result["collator"]: max(abs(a - b) for a, b in zip(losses[result["collator"]], result["losses"]))
                   for result in document["results"]}
    for result in document["results"]:
        assert len(losses[result["collator"]]) == len(result["losses"]) == 3, result["collator"]
    assert max(differences.values()) < TOLERANCE, differences
    # Not two frozen models: the collators that train other batches or attend across examples differ.
    assert max(abs(a - b) for a, b in zip(losses["naive-concat"], losses["flatten"])) > 10 * TOLERANCE


def test_the_script_runs_as_a_fine_tuner_runs_it(first_case):
    folder, document = first_case
    done = subprocess.run([sys.executable, str(folder / "train_trl-bfd.py")], capture_output=True, text=True,
                          env=offline_env(), cwd=tempfile.gettempdir(), timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    losses = json.loads(done.stdout.strip().splitlines()[-1])
    burst = next(result for result in document["results"] if result["collator"] == "trl-bfd")
    assert max(abs(a - b) for a, b in zip(losses, burst["losses"])) < TOLERANCE


def _code_lines(text: str) -> list[str]:
    """The script's statements: its docstring and comments left out."""
    body = text.split('"""', 2)[2]
    return [line.split("  #")[0].rstrip() for line in body.splitlines() if line.strip() and
            not line.lstrip().startswith("#")]


def test_the_diff_from_padded_is_the_change_a_user_makes(first_case):
    folder, _ = first_case
    padded = _code_lines((folder / "train_padded.py").read_text())
    changed = {name: [line for line in difflib.unified_diff(padded, _code_lines((folder / f"train_{name}.py")
                                                                                .read_text()), lineterm="", n=0)
                      if line[:1] in "+-" and not line.startswith(("+++", "---"))]
               for name in ("flatten", "naive-concat", "padded-grouped")}
    # padding-free: the collator (and its import), nothing else
    assert changed["flatten"] == [
        "-from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, "
        "TrainingArguments",
        "+from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorWithFlattening, Trainer, "
        "TrainingArguments",
        '-data_collator = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)',
        "+data_collator = DataCollatorWithFlattening()"], changed["flatten"]
    assert changed["naive-concat"][-1] == "+data_collator = DataCollatorWithFlattening(return_position_ids=False)"
    assert changed["padded-grouped"] == ['-    train_sampling_strategy="sequential",',
                                         '+    train_sampling_strategy="group_by_length",']
