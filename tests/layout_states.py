"""The page's states a layout test measures, reached in a browser tab as a person would reach them, and what each
state measured (tests/layout_checks.py), kept by (width, state) so that every check of a state reads one
measurement.

One tab per screen width, drawn at that screen's pixel density; each state is reached from the one before it (a
click or an entry), so that a width costs one page load: the defaults, then the memory planner's answer, LoRA,
`small-llama` (a model whose run would be long: the prediction warns), an uploaded file with notes on what it leaves
out, and two saved runs redrawn from the history (three packed collators: headline cards; seven: the
compact table).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError

from layout_checks import FIGURES, FIGURES_LOADED, NARROW_CELLS, OVERFLOWS, POSITIONS, SELECTORS

# Width -> (height, device pixels per CSS pixel): two phones (an Android's 360 x 740, an iPhone's 390 x 844), a
# tablet, a laptop, a retina laptop (a 13-inch MacBook Air's default 1440 x 900 at 2x) and a desktop monitor.
SCREENS = {360: (740, 3), 390: (844, 3), 768: (1024, 2), 1280: (800, 1), 1440: (900, 2), 1920: (1080, 1)}
PHONE_WIDTHS = tuple(width for width in SCREENS if width < 700)  # page.css's phone layout is below 700 px
# In the order a tab goes through them; each is reached from the one before.
STATES = ("defaults", "planner", "lora", "small-llama", "upload-warning", "3-packed", "7-collators")
BEFORE_TRAINING = ("defaults", "lora", "small-llama", "upload-warning")  # states whose page shows the prediction only
LORA_RANK = 8
STATE_TIMEOUT_MS = 120_000  # a preview on two shared cores: seconds, a minute when they are busy


def chat_file(folder: Path) -> Path:
    """A small team file of chat conversations: fewer examples than the page asks for, and a field no part of the
    layout reads (the preview notes both under its table)."""
    path = folder / "support-chats.jsonl"
    path.write_text("\n".join(json.dumps({
        "messages": [{"role": "user", "content": f"How do I reset my password? Ticket {index}."},
                     {"role": "assistant", "content": "Open Settings, then Security, then Reset. " * (1 + index % 9)}],
        "source": "support wiki page " * 3}) for index in range(40)))
    return path


class Screens:
    """Tabs of one browser, a width each, taken through `STATES`; `measured(width, state)` reaches the state once and
    returns what it measured (or fails again with the error that kept it from being reached)."""

    def __init__(self, browser, url: str, run_ids: dict[str, str], upload: Path, screenshots: Path):
        """`run_ids`: the saved run each results state redraws from the history, by state."""
        self.browser, self.url, self.run_ids, self.upload, self.screenshots = browser, url, run_ids, upload, screenshots
        self.tab, self.tab_width, self.tab_state = None, None, None
        self.results: dict[tuple[int, str], dict | Exception] = {}

    def measured(self, width: int, state: str) -> dict:
        key = (width, state)
        if key not in self.results:
            try:
                self.results[key] = self._reach_and_measure(width, state)
            except Exception as error:  # noqa: BLE001 - kept, so that every check of this state reports it
                self.results[key] = error
                with contextlib.suppress(PlaywrightError):  # what the page showed instead, if it still can
                    self.tab.screenshot(path=str(self.screenshots / f"{width}px-{state}-not-reached.png"),
                                        full_page=True, scale="css")
        result = self.results[key]
        if isinstance(result, Exception):
            raise AssertionError(f"the page did not reach state {state!r} at {width} px: {result}") from result
        return result

    def close(self) -> None:
        if self.tab is not None:
            self.tab.close()
            self.tab = self.tab_width = self.tab_state = None

    def save(self, path: Path) -> None:
        """Every measurement (or why its state was not reached), by "<width>px-<state>", as JSON."""
        path.write_text(json.dumps({f"{width}px-{state}": repr(result) if isinstance(result, Exception) else result
                                    for (width, state), result in self.results.items()}, indent=1))

    # ---- reaching a state -----------------------------------------------------------------------------------------

    def _reach_and_measure(self, width: int, state: str) -> dict:
        if self.tab_width != width:
            self.close()
            height, pixel_ratio = SCREENS[width]
            self.tab = self.browser.new_page(viewport={"width": width, "height": height},
                                             device_scale_factor=pixel_ratio)
            self.tab.set_default_timeout(STATE_TIMEOUT_MS)
            self.tab_width, self.tab_state = width, None
        target = STATES.index(state)
        start = 0 if self.tab_state is None or STATES.index(self.tab_state) >= target else \
            STATES.index(self.tab_state) + 1
        steps_s = {}
        self.tab_state = None  # until the last step is done: a failed step leaves the tab anywhere
        for step in STATES[start:target + 1]:
            started = time.perf_counter()
            getattr(self, "_" + step.replace("-", "_"))()
            steps_s[step] = round(time.perf_counter() - started, 1)
            self.tab_state = step
        return {**self._measure(width, state), "reached_s": steps_s}

    def _settled(self, changed_js: str, arg=None) -> None:
        """Waits for `changed_js` (the state's own sign that its views arrived), then for every figure's image."""
        self.tab.wait_for_function(changed_js, arg=arg)
        self.tab.wait_for_function(FIGURES_LOADED)

    def _cost_text(self) -> str:
        return self.tab.evaluate("() => document.querySelector('#cost')?.innerText ?? ''")

    def _preview_of(self, line_part: str, cost_before: str, cost_part: str = "") -> None:
        """A preview was asked for: the line over the batch names `line_part`, and the table under it (which comes
        after the batch) changed and says `cost_part`."""
        self._settled("([part, before, says]) => document.querySelector('#batch-source').innerText.includes(part) "
                      "&& ((cost) => cost !== before && cost.includes(says))"
                      "(document.querySelector('#cost')?.innerText ?? '')", [line_part, cost_before, cost_part])

    def _defaults(self) -> None:
        self.tab.goto(self.url)
        self._settled("ids => document.querySelector('#cost td') && document.querySelector('#lengths-plot img') "
                      "&& ids.every(id => document.querySelector('#history').innerText.includes(id))",
                      list(self.run_ids.values()))

    def _planner(self) -> None:
        self.tab.click("#plan")
        self._settled("() => document.querySelector('#plan-summary').innerText.includes('Peak per device') "
                      "&& document.querySelector('#plan-bars img') && document.querySelector('#plan-curve img')")

    def _lora(self) -> None:
        cost = self._cost_text()
        self.tab.get_by_text("More settings").first.click()  # the run's (the planner's comes later in the page)
        rank = self.tab.locator("#lora-rank input")
        rank.fill(str(LORA_RANK))
        rank.press("Enter")
        self._preview_of(f"LoRA rank {LORA_RANK}", cost)

    def _small_llama(self) -> None:
        cost = self._cost_text()
        rank = self.tab.locator("#lora-rank input")
        rank.fill("0")
        rank.press("Enter")
        self._preview_of("LoRA rank 0", cost)
        cost = self._cost_text()
        # The run's chip: the first of that name in the page (the planner's chips come later).
        self.tab.get_by_role("button", name="small-llama", exact=True).first.click()
        self._preview_of("batch of small-llama", cost, "⚠ long")

    def _upload_warning(self) -> None:
        cost = self._cost_text()
        self.tab.get_by_role("button", name="tiny-llama", exact=True).first.click()
        self._preview_of("batch of tiny-llama", cost)
        cost = self._cost_text()
        self.tab.locator("#upload input[type=file]").set_input_files(str(self.upload))
        self._preview_of(self.upload.name, cost, "the dataset has 40")

    def _history_run(self, state: str) -> None:
        run_id = self.run_ids[state]
        cost = self._cost_text()
        self.tab.locator("#history").get_by_text(run_id).filter(visible=True).first.click()
        self._settled("([id, before]) => document.querySelector('#results-source').innerText.includes(`run ${id}`) "
                      "&& document.querySelector('#anatomy-plot img') "
                      "&& (document.querySelector('#cost')?.innerText ?? '') !== before", [run_id, cost])
        if not self.tab.locator("#details").is_visible():  # the folded reasons under the headline, opened
            self.tab.locator("#headline-details").get_by_text("Why each collator").click()
            self.tab.locator("#details").wait_for(state="visible")

    def _3_packed(self) -> None:
        self._history_run("3-packed")

    def _7_collators(self) -> None:
        self._history_run("7-collators")

    # ---- measuring it ---------------------------------------------------------------------------------------------

    def _measure(self, width: int, state: str) -> dict:
        tab = self.tab
        tab.mouse.move(0, 0)
        tab.evaluate("() => window.scrollTo(0, 0)")  # the sticky bar at its place in the page
        tab.wait_for_timeout(300)  # Gradio's fade of an output that just arrived
        measured = {"narrow_cells": tab.evaluate(NARROW_CELLS), "overflows": tab.evaluate(OVERFLOWS, SELECTORS),
                    "figures": tab.evaluate(FIGURES), "positions": tab.evaluate(POSITIONS)}
        started = time.perf_counter()
        tab.screenshot(path=str(self.screenshots / f"{width}px-{state}.png"), full_page=True, scale="css")
        return {**measured, "screenshot_s": round(time.perf_counter() - started, 1)}
