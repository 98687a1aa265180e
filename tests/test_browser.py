"""The page in a real Chromium (Debian's package, driven by Playwright through its executable path), at a desktop's
size and at a phone's (390 x 844).

Chooses options like a person would, runs small comparisons, and checks what a person would see: the picture and
the numbers of the same run, speed, memory and loss of each packed collator big on the first screen with the three
figures beside them (a desktop) or reached by Run (a phone), figures drawn for the screen's width and pixel density
(sharp on a phone's 3 device pixels per CSS pixel), Run off while it trains, a history click that puts that run's
settings back, an error message that stays, a phone page without sideways scrolling whose Run stays in reach, every
collator told apart, every figure described to screen readers, and text contrast of at least 4.5:1 (WCAG AA).
Saves screenshots and timings under test-artifacts/ (the README's come from tests/readme_screenshots.py). Then uploads a
file in a tab of its own: its run is listed in that tab only, the upload box empties, and closing the tab deletes
the run.
"""

import json
import time
from pathlib import Path

import pytest

import demo_core
from serving.sessions import Session

from chromium import needs_chromium

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
DESKTOP, PHONE = {"width": 1500, "height": 1000}, {"width": 390, "height": 844}
RUN_TIMEOUT_MS = 600_000  # two shared cores: a run's time varies 2-3x from minute to minute

pytestmark = needs_chromium

PICTURE_SOURCE = "() => document.querySelector('#batch-plot img')?.src ?? ''"
RUN_DISABLED = "() => document.querySelector('#run').disabled"
DONE = "() => /^(Done|Stopped)/.test(document.querySelector('#headline').innerText.trim())"
# What sticks out of the window sideways: the page's own scroll width, and (since Gradio's container clips what
# overflows it instead of scrolling) any element past the right edge that no box of its own scrolls or clips.
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const sticking = [];
  for (const element of document.querySelectorAll('body *')) {
    const box = element.getBoundingClientRect();
    if (!box.width || !box.height || box.right <= width + 1) continue;
    let held = false;
    for (let node = element.parentElement; node && !node.classList.contains('gradio-container');
         node = node.parentElement) {
      const inWindow = node.getBoundingClientRect().right <= width + 1;
      if (inWindow && ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(node).overflowX)) {
        held = true;
        break;
      }
    }
    if (!held) sticking.push(`${element.tagName}#${element.id}.${element.className}`.slice(0, 80));
  }
  return {page: Math.max(0, document.documentElement.scrollWidth - window.innerWidth), sticking};
}"""
NO_OVERFLOW = {"page": 0, "sticking": []}
PLOT_ALTS = "() => [...document.querySelectorAll('[data-testid=matplotlib] img')].map(image => image.alt)"
# Every visible text's contrast with what is behind it (WCAG 2: relative luminance, backgrounds blended upwards).
CONTRASTS = """() => {
  const rgba = (text) => { const [r, g, b, a = 1] = text.match(/[\\d.]+/g).map(Number); return {r, g, b, a}; };
  const over = (top, below) => ({r: top.r * top.a + below.r * (1 - top.a), g: top.g * top.a + below.g * (1 - top.a),
                                 b: top.b * top.a + below.b * (1 - top.a), a: 1});
  const background = (element) => {
    const layers = [];
    for (let node = element; node; node = node.parentElement) {
      const colour = rgba(getComputedStyle(node).backgroundColor);
      if (colour.a > 0) layers.push(colour);
      if (colour.a >= 1) break;
    }
    return layers.reverse().reduce((below, top) => over(top, below), {r: 255, g: 255, b: 255, a: 1});
  };
  const luminance = ({r, g, b}) => [r, g, b].map(v => v / 255)
    .map(v => v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4)
    .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const texts = [];
  for (const element of document.querySelectorAll('body *')) {
    const own = [...element.childNodes].some(node => node.nodeType === 3 && node.textContent.trim());
    const style = getComputedStyle(element);
    if (!own || !element.getClientRects().length || style.visibility === 'hidden' || element.closest(':disabled'))
      continue;
    const behind = background(element);
    const [light, dark] = [luminance(over(rgba(style.color), behind)), luminance(behind)].sort((a, b) => b - a);
    texts.push({ratio: (light + 0.05) / (dark + 0.05), text: element.textContent.trim().slice(0, 60),
                info: element.classList.contains('info-text')});
  }
  return texts;
}"""
# Numbers in the tables ("2,048", "1.2e+00", "117.3 MB": digits, no word), each on one line: a text node drawn over
# two lines has two client rects.
BROKEN_NUMBERS = """() => [...document.querySelectorAll('#results, #contamination, #cost')].flatMap(table => {
  const walker = document.createTreeWalker(table, NodeFilter.SHOW_TEXT);
  const broken = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const number = /\\d/.test(node.textContent) && !/[a-z]{3}/i.test(node.textContent);
    if (!number || !node.parentElement.closest('td')) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    if (range.getClientRects().length > 1) broken.push(node.textContent);
  }
  return broken;
})"""


def _set_slider(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


ASKED_OR_STARTED = ("() => document.querySelector('#action-bar').classList.contains('asking') "
                    "|| document.querySelector('#run').disabled")


def press_run(page) -> None:
    """Run, as a person presses it: a run its preview warns about (long, or refused for its memory) asks first
    (serving/page.py ASK_OR_RUN), and the person answers "Run anyway"; any other starts at once."""
    page.click("#run")
    page.wait_for_function(ASKED_OR_STARTED, timeout=10_000)
    if page.locator("#action-bar.asking").count():
        page.click("#run-anyway")


def _tick(page, *collators: str) -> None:
    for name in collators:
        page.locator(f'#collators input[name="{name}"]').click()


def _inputs(page) -> dict:
    return page.evaluate("""() => ({
        model: document.querySelector('#model textarea, #model input').value,
        samples: Number(document.querySelector('#samples input[type=number]').value),
        steps: Number(document.querySelector('#steps input[type=number]').value),
        collators: [...document.querySelectorAll('#collators input:checked')].map(box => box.name)})""")


def _card_numbers(page, collator: str) -> list[str]:
    """The big numbers of a collator's card in the headline: speed vs padded, peak memory vs padded, max |Δloss|."""
    card = page.locator("#headline .glance-card", has_text=collator)
    return [number.inner_text() for number in card.locator(".glance-number").all()]


def _details(page) -> str:
    """The folded lines under the headline, opened as a person would."""
    page.locator("#headline-details").get_by_text("Why each collator").click()
    page.locator("#details").wait_for(state="visible")
    return page.locator("#details").inner_text()


# Each figure image's device pixels per CSS pixel it is shown at (drawn for the screen's width and density).
FIGURE_DENSITIES = """() => [...document.querySelectorAll('[data-testid=matplotlib] img')]
  .filter(image => image.clientWidth).map(image => image.naturalWidth / image.clientWidth)"""


def _history_row(page, run_id: str):
    return page.locator("#history").get_by_text(run_id).filter(visible=True).first


def _check_readable(page) -> None:
    """Every figure described for screen readers, and every text at least AA contrast (hints included)."""
    alts = page.evaluate(PLOT_ALTS)
    assert alts and all(len(alt) > 40 and "undefined" not in alt for alt in alts), alts
    assert len(set(alts)) == len(alts), alts  # each says what its own figure shows
    texts = page.evaluate(CONTRASTS)
    assert any(text["info"] for text in texts)  # the hints under the inputs were measured
    low = [(round(text["ratio"], 2), text["text"]) for text in texts if text["ratio"] < 4.5]
    assert low == [], low


def _screenshot(page, name: str, full_page: bool = False) -> None:
    """The page from its top (the action bar sticks where the window was scrolled to), the pointer off the buttons."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.mouse.move(0, 0)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.wait_for_timeout(500)  # the Run button's fade back from disabled
    page.screenshot(path=str(ARTIFACTS / name), full_page=full_page)


def _tab(browser, viewport: dict, pixel_ratio: float = 1):
    tab = browser.new_page(viewport=viewport, device_scale_factor=pixel_ratio)
    tab.set_default_timeout(60_000)
    return tab


@pytest.fixture(scope="module")
def page(browser):
    tab = _tab(browser, DESKTOP)
    yield tab
    tab.close()


def test_choose_run_and_read_the_speedup(page, lab_app):
    timings = {}
    started = time.perf_counter()
    page.goto(lab_app.demo.local_url)
    page.wait_for_selector("#batch-plot img")
    timings["load_to_first_picture_s"] = time.perf_counter() - started

    # A collator click redraws the batch picture (a new mask panel is highlighted): the before-training view.
    before = page.evaluate(PICTURE_SOURCE)
    clicked = time.perf_counter()
    _tick(page, "naive-concat")
    page.wait_for_function(f"old => ({PICTURE_SOURCE})() !== old", arg=before)
    timings["click_to_new_picture_s"] = time.perf_counter() - clicked
    _set_slider(page, "samples", 96)
    _set_slider(page, "steps", 8)
    page.wait_for_function("() => document.querySelector('#batch-source').innerText.includes('96 samples')")

    clicked = time.perf_counter()
    press_run(page)
    # Off until the run ends, so that a second click is never silently ignored; the last run's views are gone.
    page.wait_for_function(RUN_DISABLED, timeout=10_000)
    page.wait_for_function("() => document.querySelector('#results-source').innerText.includes('Training')")
    assert page.evaluate(RUN_DISABLED) and page.locator("#headline").inner_text().startswith("Training")
    page.wait_for_function(DONE, timeout=RUN_TIMEOUT_MS)
    timings["click_to_comparison_done_s"] = time.perf_counter() - clicked
    page.wait_for_function(f"() => !({RUN_DISABLED})()", timeout=10_000)

    _screenshot(page, "browser-run.png", full_page=True)
    headline = page.locator("#headline").inner_text()
    assert headline.startswith("Done"), headline
    entry = lab_app.HISTORY.entries()[-1]
    # Speed, memory and loss of each packed collator, big, as the engine measured them.
    speedup, memory, loss = _card_numbers(page, "flatten")
    flatten = entry.document["comparison"]["flatten"]
    assert float(speedup.rstrip("×")) == pytest.approx(flatten["speedup_vs_padded"], abs=0.005)
    assert memory == f"{flatten['peak_memory_vs_padded']:+.0%}".replace("-", "−")
    assert float(loss) == pytest.approx(flatten["max_abs_loss_diff_vs_padded"], rel=0.05, abs=1e-9)
    assert len(_card_numbers(page, "naive-concat")) == 3
    # On a 1440 x 900 screen the numbers and the three figures are all on the first screen.
    page.set_viewport_size({"width": 1440, "height": 900})
    page.evaluate("() => window.scrollTo(0, 0)")
    for element in ("#headline .glance-card >> nth=0", "#throughput-plot img", "#memory-plot img", "#loss-plot img"):
        box = page.locator(element).bounding_box()
        assert box and box["y"] >= 0 and box["y"] + box["height"] <= 900, (element, box)
    page.set_viewport_size(DESKTOP)
    assert demo_core.COLLATORS["naive-concat"].why in _details(page)  # the reasons, folded under the numbers
    assert f"run {entry.run_id}" in page.locator("#results-source").inner_text()
    assert "Not the settings" not in page.locator("#batch-source").inner_text()
    for plot in ("throughput-plot", "loss-plot", "memory-plot", "lengths-plot"):
        assert page.locator(f"#{plot} img").count() == 1, plot
    table = page.locator("#results").inner_text()
    assert all(name in table for name in ("padded", "flatten", "naive-concat")), table
    assert entry.document["contamination"] and "naive-concat max" in page.locator("#contamination").inner_text()
    assert _history_row(page, entry.run_id).count() == 1
    _check_readable(page)

    timings["flatten_speedup"] = speedup
    (ARTIFACTS / "browser-timings.json").write_text(json.dumps(timings, indent=2))
    print("browser timings:", timings)


def test_a_history_click_puts_that_runs_settings_back_without_training(page, lab_app):
    entry = lab_app.HISTORY.entries()[-1]  # the previous test's run: 96 samples, 8 steps, with naive-concat
    assert entry.document["config"]["samples"] == 96
    _set_slider(page, "samples", 40)
    _tick(page, "naive-concat")
    page.wait_for_function("() => document.querySelector('#batch-source').innerText.includes('Not the settings of')")
    assert "samples 96 there, 40 here" in page.locator("#batch-source").inner_text()
    runs_before = len(lab_app.HISTORY.entries())

    _history_row(page, entry.run_id).click()
    page.wait_for_function("() => document.querySelector('#samples input[type=number]').value === '96'")
    assert _inputs(page) == {"model": "tiny-llama", "samples": 96, "steps": 8,
                             "collators": ["padded", "flatten", "naive-concat"]}
    page.wait_for_function("() => !document.querySelector('#batch-source').innerText.includes('Not the settings')")
    time.sleep(2)  # long enough for a run to have started, had the click started one
    assert not page.evaluate(RUN_DISABLED) and len(lab_app.HISTORY.entries()) == runs_before
    assert f"run {entry.run_id}" in page.locator("#results-source").inner_text()


def test_a_bad_choice_shows_one_message_that_stays_and_the_page_keeps_working(page, lab_app):
    page.goto(lab_app.demo.local_url)
    page.wait_for_selector("#batch-plot img")
    shown_at = time.monotonic()
    model = page.locator("#model textarea, #model input").first
    model.fill("/etc")
    model.press("Enter")
    page.locator(".toast-body", has_text="outside the folders this app may read").wait_for()
    assert "Traceback" not in page.content()
    # The line over the picture says that it still shows the earlier inputs.
    page.wait_for_function("() => document.querySelector('#batch-source').innerText.includes('could not be drawn')")

    # A hub id that a preset's name contains: Enter keeps what was typed (a Dropdown picked `tiny-gpt2`).
    model.fill("gpt2")
    model.press("Enter")
    page.locator(".toast-body", has_text="cannot load model 'gpt2'").wait_for()
    assert _inputs(page)["model"] == "gpt2"
    press_run(page)  # the run fails the same way: one more message, and Run comes back
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('did not finish')")
    page.wait_for_function(f"() => !({RUN_DISABLED})()", timeout=10_000)

    page.locator(".chips button", has_text="tiny-qwen2").click()  # the page still answers: a chip draws its batch
    page.wait_for_function("() => document.querySelector('#batch-source').innerText.startsWith('Shown: the first "
                           "batch of tiny-qwen2')")
    assert _inputs(page)["model"] == "tiny-qwen2"
    time.sleep(max(0.0, 12 - (time.monotonic() - shown_at)))  # Gradio's default would have closed it after 10 s
    assert page.locator(".toast-body", has_text="outside the folders this app may read").count() == 1


PLAN_SUMMARY = "() => document.querySelector('#plan-summary').innerText"


def test_will_it_fit_answers_the_question_on_the_page_and_a_chip_asks_for_another_model(page, lab_app):
    from serving import planner_page

    page.goto(lab_app.demo.local_url)
    page.wait_for_selector("#batch-plot img")
    clicked = time.perf_counter()
    page.click("#plan")
    page.wait_for_function(f"() => ({PLAN_SUMMARY})().includes('Peak per device')")
    answer_s = time.perf_counter() - clicked
    expected = demo_core.plan(planner_page._request(**planner_page.PAGE_DEFAULTS))
    summary = page.evaluate(PLAN_SUMMARY)
    assert f"Peak per device: {expected.device.peak_bytes / 2 ** 30:,.1f} GiB" in summary, summary
    assert planner_page.DEFAULT_MODEL in summary
    assert page.locator("#plan-bars img").count() == 1 == page.locator("#plan-curve img").count()

    page.locator(".chips button", has_text="Qwen2.5-0.5B").click()  # fills the box; the button asks again
    page.wait_for_function("() => document.querySelector('#plan-model textarea, #plan-model input').value "
                           "=== 'Qwen2.5-0.5B'")
    page.click("#plan")
    page.wait_for_function(f"() => ({PLAN_SUMMARY})().includes('Qwen2.5-0.5B')")
    _check_readable(page)  # the planner's figures are described too, and its text has AA contrast
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "browser-plan-timing.json").write_text(json.dumps({"click_to_first_plan_s": answer_s}))


def test_on_a_phone_every_collator_is_readable_and_run_stays_in_reach(browser, lab_app):
    phone = _tab(browser, PHONE, pixel_ratio=3)  # a phone's screen: 3 device pixels per CSS pixel
    phone.goto(lab_app.demo.local_url)
    phone.wait_for_selector("#batch-plot img")
    assert phone.evaluate(OVERFLOW) == NO_OVERFLOW
    phone.keyboard.press("Tab")
    assert phone.evaluate("() => document.activeElement.id") == "run"  # first in the tab order

    before = phone.evaluate(PICTURE_SOURCE)
    _tick(phone, "naive-concat", "bfd", "padded-grouped", "trl-padding-free", "trl-bfd")
    _set_slider(phone, "samples", 16)
    _set_slider(phone, "steps", 2)
    _set_slider(phone, "batch-size", 4)
    phone.wait_for_function("() => document.querySelector('#batch-source').innerText.includes('trl-bfd · 2 steps "
                            "· batch 4')")
    assert phone.evaluate(PICTURE_SOURCE) != before
    # The picture is drawn for the phone's width (a desktop's 16-inch picture would be shrunk 3.5x) and density: 3
    # device pixels per CSS pixel, so that it is sharp there.
    assert phone.evaluate(FIGURE_DENSITIES) == [pytest.approx(3, abs=0.05)] * 2  # the batch and the lengths

    phone.locator("#results-source").scroll_into_view_if_needed()  # past the picture: Run is still on screen
    box = phone.locator("#run").bounding_box()
    assert box and 0 <= box["y"] and box["y"] + box["height"] <= PHONE["height"]
    press_run(phone)
    phone.wait_for_function(RUN_DISABLED, timeout=10_000)
    # Run takes the visitor from the settings (the phone's first screens) to the headline, where the results come.
    phone.wait_for_function("() => { const top = document.querySelector('#headline').getBoundingClientRect().top; "
                            "return top >= 0 && top < window.innerHeight / 2; }", timeout=10_000)
    phone.wait_for_function(DONE, timeout=RUN_TIMEOUT_MS)
    phone.wait_for_function(f"() => !({RUN_DISABLED})()", timeout=10_000)
    headline = phone.locator("#headline").bounding_box()
    assert 0 <= headline["y"] < PHONE["height"] / 2, headline  # still there: the results fill in under it
    # Six packed collators: a compact table of their numbers, a row each; every figure sharp and drawn to fit.
    assert phone.locator("#headline .glance-table tbody tr").count() == len(demo_core.COLLATORS) - 1
    assert phone.evaluate(FIGURE_DENSITIES) == [pytest.approx(3, abs=0.05)] * 6

    _screenshot(phone, "browser-phone.png")
    _screenshot(phone, "browser-phone-full.png", full_page=True)
    assert phone.evaluate(OVERFLOW) == NO_OVERFLOW  # seven rows of results, and nothing sticks out sideways
    assert phone.evaluate(BROKEN_NUMBERS) == []
    # Each collator's row in the headline (padded's in the baseline's line) and its line in the details carries its
    # plot colour: seven different ones, TRL's included.
    details = _details(phone)
    for where in ("#headline", "#details"):
        colours = phone.evaluate(f"() => [...document.querySelectorAll('{where} .collator-key')]"
                                 ".map(key => getComputedStyle(key).backgroundColor)")
        assert len(colours) == len(demo_core.COLLATORS) == len(set(colours)), (where, colours)
    assert all(spec.why in details for spec in demo_core.COLLATORS.values())
    _check_readable(phone)
    phone.close()


def test_an_uploaded_file_runs_privately_and_its_runs_leave_with_the_tab(browser, lab_app, tmp_path):
    data = tmp_path / "team-notes.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"note {i}: " + "ship it " * (2 + i % 11)}) for i in range(40)))
    tab = _tab(browser, DESKTOP)  # a session of its own, closed at the end
    tab.goto(lab_app.demo.local_url)
    tab.wait_for_selector("#batch-plot img")
    before = tab.evaluate(PICTURE_SOURCE)
    tab.locator("#upload input[type=file]").set_input_files(str(data))
    tab.wait_for_function(f"old => ({PICTURE_SOURCE})() !== old", arg=before)  # the upload's batch is drawn
    _set_slider(tab, "samples", 16)
    _set_slider(tab, "steps", 2)
    press_run(tab)
    tab.wait_for_function("() => /was deleted from the server/.test(document.querySelector('#status').innerText)",
                          timeout=RUN_TIMEOUT_MS)
    entry = lab_app.HISTORY.entries()[-1]
    assert entry.private and entry.document["config"]["dataset"] == "team-notes.jsonl"
    assert "team-notes.jsonl (private to this tab)" in tab.locator("#history").inner_text()
    assert "team-notes.jsonl" not in tab.locator("#upload").inner_text()  # the box is empty: the file is gone
    other = _tab(browser, DESKTOP)  # another visitor: sees the shared runs (once the table has loaded), not this one
    other.goto(lab_app.demo.local_url)
    shared = [row[0] for row in lab_app.history_view.table(lab_app.HISTORY, Session("another visitor"))]
    other.wait_for_function("ids => document.querySelector('#history')?.innerText.includes(ids.at(-1) ?? '')",
                            arg=shared)
    assert entry.run_id not in other.locator("#history").inner_text()
    other.close()
    tab.close()  # Gradio's unload: the session ended, and nobody can list its private run any more
    deadline = time.monotonic() + 90
    while any(saved.run_id == entry.run_id for saved in lab_app.HISTORY.entries()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(saved.run_id != entry.run_id for saved in lab_app.HISTORY.entries())
