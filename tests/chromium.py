"""The browser every page test drives: Debian's Chromium through Playwright, headless, with no network of its own.

`.ci/run` installs it (apt-get install chromium); where it is missing the browser tests skip with that reason.
"""

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                    "(apt-get install chromium; .ci/run installs it)")


def launch_chromium(playwright):
    """Chromium started headless from `playwright` (a sync_playwright() context)."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
