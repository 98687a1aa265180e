"""The page in a real Chromium (Debian's package, driven by Playwright through its executable path).

Chooses options like a person would, runs a small comparison, waits for the figures, reads the speedup off the page,
and saves a screenshot under test-artifacts/ (copy it to docs/screenshot.png to refresh the README's). Prints and
saves the timings: page load -> first picture, click -> new picture, click -> comparison done. Then uploads a file
in a tab of its own: its run is listed in that tab only, the upload box empties, and closing the tab deletes the run.
"""

import json
import re
import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                "(apt-get install chromium; .ci/run installs it)")

PICTURE_SOURCE = "() => document.querySelector('#batch-plot img')?.src ?? ''"


def _set_slider(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


@pytest.fixture(scope="module")
def page(lab_app):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        tab = browser.new_page(viewport={"width": 1500, "height": 1000})
        tab.set_default_timeout(60_000)
        yield tab
        browser.close()


def test_choose_run_and_read_the_speedup(page, lab_app):
    timings = {}
    started = time.perf_counter()
    page.goto(lab_app.demo.local_url)
    page.wait_for_selector("#batch-plot img")
    timings["load_to_first_picture_s"] = time.perf_counter() - started

    # A collator click redraws the batch picture (a new mask panel is highlighted): the before-training view.
    before = page.evaluate(PICTURE_SOURCE)
    clicked = time.perf_counter()
    page.locator("#collators label", has_text="naive-concat").click()
    page.wait_for_function(f"old => ({PICTURE_SOURCE})() !== old", arg=before)
    timings["click_to_new_picture_s"] = time.perf_counter() - clicked
    _set_slider(page, "samples", 96)
    _set_slider(page, "steps", 8)

    clicked = time.perf_counter()
    page.click("#run")
    page.wait_for_function("() => /^(Done|Stopped)/.test(document.querySelector('#headline').innerText.trim())",
                           timeout=600_000)
    timings["click_to_comparison_done_s"] = time.perf_counter() - clicked

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-run.png"), full_page=True)
    headline = page.locator("#headline").inner_text()
    assert headline.startswith("Done"), headline
    speedup = float(re.search(r"flatten: ([\d.]+)×", headline).group(1))
    saved = lab_app.HISTORY.entries()[-1].document  # the page shows the engine's number, not its own
    assert speedup == pytest.approx(saved["comparison"]["flatten"]["speedup_vs_padded"], abs=0.005)
    assert "naive-concat" in headline
    for plot in ("throughput-plot", "loss-plot", "memory-plot", "lengths-plot"):
        assert page.locator(f"#{plot} img").count() == 1, plot
    table = page.locator("#results").inner_text()
    assert all(name in table for name in ("padded", "flatten", "naive-concat")), table
    assert saved["contamination"] and "naive-concat max" in page.locator("#contamination").inner_text()
    assert page.locator("#history").get_by_text(lab_app.HISTORY.entries()[-1].run_id).count() >= 1

    timings["flatten_speedup"] = speedup
    (ARTIFACTS / "browser-timings.json").write_text(json.dumps(timings, indent=2))
    print("browser timings:", timings)


def test_a_bad_choice_shows_one_message_and_the_page_keeps_working(page, lab_app):
    page.goto(lab_app.demo.local_url)
    page.wait_for_selector("#batch-plot img")
    model = page.locator("#model input")
    model.fill("/etc")
    model.press("Enter")
    toast = page.locator(".toast-body").first
    toast.wait_for()
    assert "outside the folders this app may read" in toast.inner_text()
    assert "Traceback" not in page.content()
    model.fill("tiny-qwen2")
    model.press("Enter")
    histogram = "() => document.querySelector('#lengths-plot img')?.src ?? ''"
    before = page.evaluate(histogram)
    _set_slider(page, "samples", 40)
    page.wait_for_function(f"old => ({histogram})() !== old", arg=before)  # the page still answers


def test_an_uploaded_file_runs_privately_and_its_runs_leave_with_the_tab(page, lab_app, tmp_path):
    data = tmp_path / "team-notes.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"note {i}: " + "ship it " * (2 + i % 11)}) for i in range(40)))
    browser = page.context.browser
    tab = browser.new_page(viewport={"width": 1500, "height": 1000})  # a session of its own, closed at the end
    tab.set_default_timeout(60_000)
    tab.goto(lab_app.demo.local_url)
    tab.wait_for_selector("#batch-plot img")
    before = tab.evaluate(PICTURE_SOURCE)
    tab.locator("#upload input[type=file]").set_input_files(str(data))
    tab.wait_for_function(f"old => ({PICTURE_SOURCE})() !== old", arg=before)  # the upload's batch is drawn
    _set_slider(tab, "samples", 16)
    _set_slider(tab, "steps", 2)
    tab.click("#run")
    tab.wait_for_function("() => /was deleted from the server/.test(document.querySelector('#status').innerText)",
                          timeout=600_000)
    entry = lab_app.HISTORY.entries()[-1]
    assert entry.private and entry.document["config"]["dataset"] == "team-notes.jsonl"
    assert "team-notes.jsonl (private to this tab)" in tab.locator("#history").inner_text()
    assert "team-notes.jsonl" not in tab.locator("#upload").inner_text()  # the box is empty: the file is gone
    other = browser.new_page()  # another visitor
    other.goto(lab_app.demo.local_url)
    other.wait_for_selector("#history")
    assert entry.run_id not in other.locator("#history").inner_text()
    other.close()
    tab.close()  # Gradio's unload: the session ended, and nobody can list its private run any more
    deadline = time.monotonic() + 90
    while any(saved.run_id == entry.run_id for saved in lab_app.HISTORY.entries()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(saved.run_id != entry.run_id for saved in lab_app.HISTORY.entries())
