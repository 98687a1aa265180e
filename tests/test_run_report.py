"""A report to send: one HTML file with every figure inside it (PNG at twice the pixels it is shown at) that opens in
Chromium without a single request beyond itself, the same as Markdown with its PNGs in a zip, and an uploaded
dataset's text in it only when asked.
"""

import base64
import html.parser
import io
import struct
import types
import zipfile
from pathlib import Path

import pytest

from demo_core import RunConfig, run_comparison
from presentation.recipe_script import with_code
from presentation.run_report import DENSITY, FIGURES, report_html, report_zip

from chromium import launch_chromium, needs_chromium

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def document() -> dict:
    config = RunConfig(samples=16, steps=4, batch_size=4, collators=("padded", "flatten"), max_length=256)
    return with_code(run_comparison(config).to_dict())


class Images(html.parser.HTMLParser):
    """Every <img>'s attributes, and every attribute value that names a place to fetch from."""

    def __init__(self):
        super().__init__()
        self.images, self.fetched = [], []

    def handle_starttag(self, tag, attributes):
        values = dict(attributes)
        if tag == "img":
            self.images.append(values)
        self.fetched += [value for name, value in attributes if name in ("src", "href") and value
                         and not value.startswith(("data:", "#"))]


def example_passage(document: dict) -> str:
    """Words of the first example as trained, inside its part that carries loss (where the report marks nothing)."""
    return document["dataset_stats"]["examples"][0]["text"].split("\n")[0][2:22]


def png_width(data: bytes) -> int:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", data[16:20])[0]


def test_the_html_holds_every_figure_and_names_nothing_to_fetch(document):
    page = report_html(document, title="run r1")
    parsed = Images()
    parsed.feed(page)
    assert parsed.fetched == [] and "http://" not in page and "https://" not in page
    assert len(parsed.images) == len(FIGURES)
    for image in parsed.images:
        assert image["src"].startswith("data:image/png;base64,") and len(image["alt"]) > 20
        assert png_width(base64.b64decode(image["src"].split(",", 1)[1])) == DENSITY * int(image["width"])
    # Its parts: the numbers, the table, the settings as trained, the versions, each collator's script.
    for part in ("At a glance", "Results per collator", "Settings", "Versions and device", "train_padded.py",
                 "train_flatten.py", "DataCollatorWithFlattening()", document["environment"]["transformers"]):
        assert part in page, part


def test_a_trimmed_mean_outside_its_middle_half_still_draws(document):
    # On a few unequal timed steps the bar (the trimmed mean) can lie above the upper quartile; seen in a 4-step run.
    result = document["results"][0]
    rate = result["tokens_per_s"]
    odd = {**document, "results": [{**result, "tokens_per_s_range": [rate * 0.5, rate * 0.9]},
                                   *document["results"][1:]]}
    parsed = Images()
    parsed.feed(report_html(odd))
    assert len(parsed.images) == len(FIGURES)


def test_the_examples_text_goes_in_only_when_asked(document):
    passage = example_passage(document)
    assert passage not in report_html(document) and passage not in report_zip(document).decode("latin-1")
    assert "left out of this report" in report_html(document)
    assert passage in report_html(document, include_examples=True)


def test_the_zip_is_the_same_report_in_markdown_with_its_pngs(document):
    with zipfile.ZipFile(io.BytesIO(report_zip(document))) as archive:
        names = sorted(archive.namelist())
        markdown = archive.read("report.md").decode()
        assert names == sorted(["report.md", *(f"figures/{name}.png" for name, _, _ in FIGURES)])
        for name, _, _ in FIGURES:
            assert f'src="figures/{name}.png"' in markdown
            assert png_width(archive.read(f"figures/{name}.png")) > 0
    assert "data:image" not in markdown and "```python" in markdown and "| collator |" in markdown


@needs_chromium
def test_the_report_opens_offline_in_chromium_with_every_figure(document, tmp_path):
    from playwright.sync_api import sync_playwright

    path = tmp_path / "report.html"
    path.write_text(report_html(document))
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        context = chromium.new_context(viewport={"width": 1200, "height": 900}, device_scale_factor=2)
        requests = []

        def refuse_anything_else(route):
            requests.append(route.request.url)
            route.continue_() if route.request.url == path.as_uri() else route.abort()

        context.route("**/*", refuse_anything_else)
        page = context.new_page()
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        shown = page.evaluate("() => [...document.images].map(image => [image.complete, image.naturalWidth, "
                              "image.clientWidth])")
        chromium.close()
    assert requests == [path.as_uri()]
    assert len(shown) == len(FIGURES)
    for complete, natural, css in shown:  # drawn, and sharp on a screen of 2 device pixels per CSS pixel
        assert complete and natural >= DENSITY * css > 0


def test_the_pages_report_of_a_private_run_leaves_its_text_out_unless_ticked(lab_app, document):
    owner = types.SimpleNamespace(session_hash="owner's tab", headers={})
    key = lab_app.Session.of(owner).key
    entry = lab_app.HISTORY.append(document, owner=key, private=True)
    home = lab_app.UI.views.takehome
    passage = example_passage(document)
    for ticked in (False, True):
        files = lab_app.download_report({"run_id": entry.run_id, "token": None}, ticked, owner)
        page, archive = Path(files[home.report_html]).read_text(), Path(files[home.report_zip]).read_bytes()
        assert (passage in page) is ticked and len(archive) > 0
    with pytest.raises(Exception, match="no longer in the history"):  # another visitor's private run: no run
        lab_app.download_report({"run_id": entry.run_id, "token": None}, True,
                                types.SimpleNamespace(session_hash="someone else", headers={}))
