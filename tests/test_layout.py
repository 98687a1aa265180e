"""The page's layout at the widths people open it at, found wrong by measurement, not by eye: Debian's Chromium (through
Playwright, as tests/test_browser.py drives it) at 360 and 390 px (phones, 3 device pixels per CSS pixel), 768 px (a
tablet, 2x), 1280, 1440 (a retina laptop, 2x) and 1920 px, in every state whose tables, cards and figures differ:
the defaults, the memory planner's answer, LoRA, `small-llama` (its predicted time warns: long), an upload with
notes on what it leaves out, and saved runs of three packed collators (headline cards) and of all seven (the compact
table). Each (width, state) is its own test id, and a failure lists each defect with its numbers:

- no table cell narrower than its longest word (letters stacked one a line);
- nothing wider than its box or the window: no text past its cell, card or number's box, none cut by a box that
  hides it or out of sight in a box that scrolls sideways, no box or text past the window (the run's wide tables,
  which scroll sideways by design, are fine);
- every figure drawn with at least the pixels the screen shows it with (drawn width >= shown width x device pixels
  per CSS pixel), so that it is sharp;
- before training, the predicted time and peak memory (and their warnings) within one screen of Run;
- on a phone: the first figure within one screen of where the settings start, and the sticky action bar at most
  12% of the screen's height, also while a run trains.

Two runs are made once (three packed collators by Run on a phone, whose action bar is measured while it trains; all
seven through the API); every width then loads the page once and goes through the states in turn, the saved
runs redrawn from the history (which draws their figures for that screen). Screenshots of each width and state go to
test-artifacts/layout/.
"""

import time

import pytest

from demo_core import COLLATORS

from chromium import needs_chromium
from layout_checks import described, figure_defects
from layout_states import BEFORE_TRAINING, PHONE_WIDTHS, SCREENS, STATES, Screens, chat_file
from test_browser import ARTIFACTS, DONE, RUN_DISABLED, RUN_TIMEOUT_MS, press_run

pytestmark = needs_chromium

THREE_PACKED = ("padded", "flatten", "naive-concat", "bfd")  # three packed: the most the headline shows as cards
# 5 steps: the fewest that time enough of them for a speedup (timing.py); 16 samples in batches of 4 keep them short
RUN_SIZE = {"samples": 16, "steps": 5, "batch_size": 4}
MAX_ACTION_BAR_SHARE = 0.12  # of a phone's screen height
CASES = [(width, state) for width in SCREENS for state in STATES]


def _case_id(case: tuple) -> str:
    return f"{case[0]}px-{case[1]}"


def _set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def _run_on_a_phone(browser, url: str, collators: tuple[str, ...]) -> dict:
    """Runs `collators` from a 390 px phone as a person would, and measures the action bar while it trains and
    after: {"training": its tallest, "after-run": its height once the run is saved}, in CSS pixels."""
    width = 390
    height, pixel_ratio = SCREENS[width]
    phone = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=pixel_ratio)
    phone.set_default_timeout(60_000)
    phone.goto(url)
    phone.wait_for_selector("#batch-plot img")
    for name in COLLATORS:
        if phone.locator(f'#collators input[name="{name}"]').is_checked() != (name in collators):
            phone.locator(f'#collators input[name="{name}"]').click()
    for setting, value in RUN_SIZE.items():
        _set_number(phone, setting.replace("_", "-"), value)
    line = f"{', '.join(collators)} · {RUN_SIZE['steps']} steps · batch {RUN_SIZE['batch_size']}"
    phone.wait_for_function("line => document.querySelector('#batch-source').innerText.includes(line)", arg=line)
    press_run(phone)
    phone.wait_for_function(RUN_DISABLED, timeout=10_000)
    bar_js = "() => document.querySelector('#action-bar').getBoundingClientRect().height"
    tallest, deadline = 0.0, time.monotonic() + RUN_TIMEOUT_MS / 1000
    while phone.evaluate(RUN_DISABLED) and time.monotonic() < deadline:  # Run is off until the run ends
        height_px = phone.evaluate(bar_js)
        if height_px > tallest:
            tallest = height_px
            phone.locator("#action-bar").screenshot(path=str(ARTIFACTS / "layout" / f"{width}px-training-bar.png"))
        time.sleep(0.25)
    assert phone.evaluate(DONE), phone.locator("#status").inner_text()  # finished, not refused or failed
    after = phone.evaluate(bar_js)
    phone.close()
    return {"training": tallest, "after-run": after}


@pytest.fixture(scope="module")
def runs(lab_app, browser, one_torch_thread) -> tuple[dict, dict]:
    """The run id each results state redraws from the history (three packed collators, run from a phone whose
    action bar is measured meanwhile; all seven, through the API), and the phone's action bar heights."""
    (ARTIFACTS / "layout").mkdir(parents=True, exist_ok=True)
    bar_heights = _run_on_a_phone(browser, lab_app.demo.local_url, THREE_PACKED)
    three = lab_app.HISTORY.entries()[-1]
    assert three.document["config"]["collators"] == list(THREE_PACKED) and not three.document["partial"]
    lab_app.compare(model="tiny-llama", collators=tuple(COLLATORS), **RUN_SIZE)
    seven = lab_app.HISTORY.entries()[-1]
    assert seven.document["config"]["collators"] == list(COLLATORS)
    return {"3-packed": three.run_id, "7-collators": seven.run_id}, bar_heights


@pytest.fixture(scope="module")
def screens(browser, lab_app, runs, tmp_path_factory):
    tabs = Screens(browser, lab_app.demo.local_url, runs[0], chat_file(tmp_path_factory.mktemp("upload")),
                   ARTIFACTS / "layout")
    yield tabs
    tabs.close()
    tabs.save(ARTIFACTS / "layout" / "measurements.json")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_no_table_cell_is_narrower_than_its_longest_word(screens, case):
    narrow = screens.measured(*case)["narrow_cells"]
    assert narrow == [], "cells narrower than their longest word (its letters stacked):\n" + described(narrow)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_nothing_is_wider_than_its_box_or_the_window(screens, case):
    overflows = screens.measured(*case)["overflows"]
    assert overflows == [], "content past its box or the window:\n" + described(overflows)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_figure_is_drawn_for_the_screens_pixel_density(screens, case):
    figures = screens.measured(*case)["figures"]
    assert figures, "no figure on the page"
    soft = figure_defects(figures)
    assert soft == [], "figures drawn with fewer pixels than the screen shows them with:\n" + described(soft)


@pytest.mark.parametrize("case", [(width, state) for width in SCREENS for state in BEFORE_TRAINING], ids=_case_id)
def test_before_training_the_prediction_is_within_a_screen_of_run(screens, case):
    where = screens.measured(*case)["positions"]
    assert where["predicted_bottom_px"] is not None, "no predicted time or memory beside Run before training"
    below_run_px = where["predicted_bottom_px"] - where["run_top_px"]
    assert below_run_px <= where["window_px"], (
        f"the predicted time and memory end {below_run_px:,.0f} px below the top of Run; the screen is "
        f"{where['window_px']} px tall")
    if case[1] == "small-llama":  # its warning with them, not only in the table further down
        assert "⚠ long" in where["forecast_text"], where["forecast_text"]


@pytest.mark.parametrize("width", PHONE_WIDTHS, ids=lambda width: f"{width}px-defaults")
def test_on_a_phone_the_first_figure_is_within_a_screen_of_the_settings(screens, width):
    where = screens.measured(width, "defaults")["positions"]
    below_settings_px = where["first_figure"]["top_px"] - where["settings_top_px"]
    assert below_settings_px <= where["window_px"], (
        f"the first figure (#{where['first_figure']['figure']}) starts {below_settings_px:,.0f} px below the "
        f"settings' top ({where['first_figure']['top_px']:,.0f} px down the page); the screen is "
        f"{where['window_px']} px tall")


@pytest.mark.parametrize("width", PHONE_WIDTHS, ids=lambda width: f"{width}px-defaults")
def test_on_a_phone_the_sticky_action_bar_is_small(screens, width):
    where = screens.measured(width, "defaults")["positions"]
    assert where["action_bar_px"] <= MAX_ACTION_BAR_SHARE * where["window_px"], (
        f"the action bar is {where['action_bar_px']:.0f} px tall: {where['action_bar_px'] / where['window_px']:.1%} "
        f"of a {where['window_px']} px screen")


@pytest.mark.parametrize("moment", ["training", "after-run"], ids=lambda moment: f"390px-3-packed-{moment}")
def test_on_a_phone_the_sticky_action_bar_stays_small_during_and_after_a_run(runs, moment):
    height_px, window_px = runs[1][moment], SCREENS[390][0]
    assert height_px <= MAX_ACTION_BAR_SHARE * window_px, (
        f"the action bar is {height_px:.0f} px tall: {height_px / window_px:.1%} of a {window_px} px screen")
