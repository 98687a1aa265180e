"""What the page says before Run (presentation/before_run.py), from a real preview of a prompt-completion file: the
trained tokens as the engine counts them, the first example with exactly its completion marked, and the one line
beside Run with its warnings and the question a long run asks."""

import html
import json
import re

import pytest

import demo_core
from presentation import before_run
from presentation.report import human_seconds


@pytest.fixture(scope="module")
def preview(tmp_path_factory):
    data = tmp_path_factory.mktemp("data") / "questions.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} plus {i}?",
                                        "completion": f" It is {2 * i}. " + "Check it twice. " * (1 + i % 4)}) + "\n"
                            for i in range(12)))
    return demo_core.preview(demo_core.RunConfig(dataset=str(data), samples=12, steps=2, batch_size=4,
                                                 max_length=128, collators=("padded", "flatten")))


def test_before_run_the_trained_tokens_are_counted_and_the_completion_is_marked(preview):
    stats = preview["dataset_stats"]
    assert stats["loss_on"] == "completion" and 0 < stats["trained_tokens"] < stats["total_tokens"]
    text = before_run.trained_example(preview)
    share = f"{stats['trained_tokens'] / stats['total_tokens']:.0%}"
    assert f"trained tokens **{stats['trained_tokens']:,} of {stats['total_tokens']:,}** ({share})" in text
    assert "TRL's default for prompt-completion data" in text
    example = stats["examples"][0]
    [shown] = re.findall(r'<pre class="as-trained">(.*?)</pre>', text, flags=re.DOTALL)
    marked = [html.unescape(re.sub(r"<[^>]+>", "", part)) for part in re.findall(r"<mark>(.*?)</mark>", shown)]
    assert marked == [example["text"][begin:end] for begin, end in example["loss_spans"]]
    assert "Question" not in "".join(marked) and "It is" in "".join(marked)  # the prompt carries no loss


def test_a_document_from_before_loss_masks_shows_no_trained_tokens():
    assert before_run.trained_example({"dataset_stats": {}, "config": {}}) == ""


def test_the_line_beside_run_says_time_and_memory_and_a_long_run_asks_first(preview):
    line = before_run.forecast_line(preview)
    assert line.startswith("Run: about ") and human_seconds(preview["predicted"]["duration_s"]) in line
    assert before_run.question(preview) == "" or preview["predicted"]["long"]
    long = {**preview, "predicted": {**preview["predicted"], "long": True, "duration_s": 600.0}}
    assert before_run.forecast_line(long).startswith("**⚠ long** · Run: about **10.0 min**")
    assert before_run.question(long).endswith("Start it anyway?") and "10.0 min" in before_run.question(long)
    guard = preview["memory_guard"]
    if guard and guard.get("available_bytes"):  # a machine that says how much memory it has
        refused = {**preview, "memory_guard": {**guard, "fits": False}}
        assert "⚠ does not fit" in before_run.forecast_line(refused) and "refused" in before_run.question(refused)
