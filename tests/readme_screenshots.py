"""The README's screenshots, from the page as it is: `python tests/readme_screenshots.py` launches the app on a
temporary data folder, runs three packed collators beside padded (through the app's API function, as
tests/test_layout.py does), and redraws that run from the history in Debian's Chromium (as tests/test_browser.py
drives it) on a 1440 px desktop (the whole page, docs/screenshot.png) and on a 390 x 844 phone at 3 device pixels
per CSS pixel (its screen at the headline, as Run leaves it: docs/screenshot-phone.png; at 2x when the 3x file is
over PHONE_MAX_BYTES)."""

import os
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("PACKING_LAB_DATA_DIR", tempfile.mkdtemp(prefix="packing-lab-screenshots-"))

import app  # noqa: E402  (after the data folder is set: the app reads it when imported)

from chromium import launch_chromium  # noqa: E402

COLLATORS = ("padded", "flatten", "bfd", "trl-padding-free")
RUN = {"samples": 64, "steps": 8, "batch_size": 8}
PHONE_MAX_BYTES = 1_500_000


def _redrawn(browser, url: str, run_id: str, viewport: dict, pixel_ratio: int):
    tab = browser.new_page(viewport=viewport, device_scale_factor=pixel_ratio)
    tab.set_default_timeout(300_000)
    tab.goto(url)
    tab.wait_for_selector("#batch-plot img")
    tab.locator("#history").get_by_text(run_id).filter(visible=True).first.click()
    tab.wait_for_function("id => document.querySelector('#results-source').innerText.includes(`run ${id}`) "
                          "&& document.querySelector('#anatomy-plot img')", arg=run_id)
    tab.wait_for_function("() => [...document.querySelectorAll('[data-testid=matplotlib] img')]"
                          ".every(image => image.complete)")
    tab.mouse.move(0, 0)
    tab.wait_for_timeout(800)  # Gradio's fade of the outputs that just arrived
    return tab


def main() -> None:
    app.launch(prevent_thread_lock=True, quiet=True)
    app.compare(model="tiny-llama", collators=COLLATORS, **RUN)
    run_id = app.HISTORY.entries()[-1].run_id
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        desktop = _redrawn(browser, app.demo.local_url, run_id, {"width": 1440, "height": 900}, 1)
        desktop.evaluate("() => window.scrollTo(0, 0)")
        desktop.screenshot(path=str(REPO / "docs" / "screenshot.png"), full_page=True)
        for pixel_ratio in (3, 2):
            phone = _redrawn(browser, app.demo.local_url, run_id, {"width": 390, "height": 844}, pixel_ratio)
            phone.evaluate("() => document.getElementById('headline').scrollIntoView({block: 'start'})")
            phone.wait_for_timeout(300)
            path = REPO / "docs" / "screenshot-phone.png"
            phone.screenshot(path=str(path))
            if path.stat().st_size <= PHONE_MAX_BYTES:
                break
        browser.close()
    app.demo.close()


if __name__ == "__main__":
    main()
