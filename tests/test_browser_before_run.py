"""Before Run, in Chromium (as tests/test_browser.py drives it): a prompt-completion file shows what will train (the
first example with its completion marked, "trained tokens N of M (x%)" as the engine counts them), the line beside
Run says the predicted time and peak memory, a run predicted long asks before it starts (Cancel starts nothing), and a
number out of its range gets the engine's one message and stays as typed."""

import json
import re

import pytest

from chromium import launch_chromium, needs_chromium
from test_browser import DESKTOP, RUN_DISABLED, press_run

pytestmark = needs_chromium

TRAINED = re.compile(r"trained tokens ([\d,]+) of ([\d,]+) \((\d+)%\)")


@pytest.fixture(scope="module")
def tab(lab_app):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        page = chromium.new_page(viewport=DESKTOP)
        page.set_default_timeout(120_000)
        page.goto(lab_app.demo.local_url)
        page.wait_for_selector("#batch-plot img")
        yield page
        chromium.close()


def test_before_run_the_page_shows_what_trains_as_the_engine_counts_it(tab, tmp_path):
    data = tmp_path / "questions.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Question {i}: what is {i} plus {i}?",
                                          "completion": f" It is {2 * i}. " + "Check it twice. " * (1 + i % 4)})
                              for i in range(30)))
    tab.locator("#upload input[type=file]").set_input_files(str(data))
    # The file's own words (the default data trains on all of each text), once its views have arrived.
    tab.wait_for_function("() => /loss on completion[^]*trained tokens/.test("
                          "document.querySelector('#trained-example').innerText)")
    words = tab.locator("#trained-example").inner_text()
    trained, total, share = (int(number.replace(",", "")) for number in TRAINED.search(words).groups())
    assert 0 < trained < total and share == round(100 * trained / total), words
    marked = tab.locator("#trained-example pre mark").all_inner_texts()
    assert marked and all("It is" in part and "Question" not in part for part in marked), marked
    assert re.match(r"Run: about [\d.]+ (s|min)", tab.locator("#forecast").inner_text()), \
        tab.locator("#forecast").inner_text()


def test_a_long_run_asks_before_it_starts_and_cancel_starts_nothing(tab, lab_app):
    runs_before = len(lab_app.HISTORY.entries())
    tab.get_by_role("button", name="small-llama", exact=True).first.click()
    tab.wait_for_function("() => document.querySelector('#forecast').innerText.includes('⚠ long')")
    tab.click("#run")
    question = tab.locator("#confirm-run")
    question.wait_for(state="visible")
    assert "Start it anyway?" in question.inner_text() and "predicted to take" in question.inner_text()
    tab.click("#run-cancel")
    question.wait_for(state="hidden")
    tab.wait_for_timeout(1000)  # a run, had one started, turns Run off at once
    assert not tab.evaluate(RUN_DISABLED) and len(lab_app.HISTORY.entries()) == runs_before


def test_a_bad_number_gives_the_engines_one_message_and_keeps_what_was_typed(tab, lab_app):
    tab.goto(lab_app.demo.local_url)
    tab.wait_for_selector("#batch-plot img")
    runs_before = len(lab_app.HISTORY.entries())
    box = tab.locator("#batch-size input[type=number]")
    box.fill("0")
    box.press("Enter")
    tab.locator(".toast-body", has_text="batch size must be between 1 and").wait_for()
    tab.locator("#samples input[type=number]").click()  # the box loses focus: Gradio's slider would put 1 back
    tab.wait_for_timeout(500)
    assert box.input_value() == "0"
    assert "less than minimum" not in " ".join(tab.locator(".toast-body").all_inner_texts())  # not Gradio's words
    press_run(tab)  # the run is refused with the same message; batch 1 never trains
    tab.wait_for_function("() => document.querySelector('#status').innerText.includes('did not finish')")
    assert box.input_value() == "0" and len(lab_app.HISTORY.entries()) == runs_before
