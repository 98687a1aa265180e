"""A link to a run: a shared link opens a read-only copy of one run, without its uploaded text, for anyone who has it,
until its owner revokes it; the sharer's other private runs and every other visitor's stay invisible, to the API
and in a second browser context alike. Every run has its own URL (`?run=<id>`), which opens it for whoever may see
it. Runs are tiny (16 samples, 2 steps, batch 4) on uploaded files, so that they are private.
"""

import json
import time
import types
import uuid
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from serving.sessions import Session
from serving.sharing import without_uploaded_text

from chromium import needs_chromium

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TINY = dict(samples=16, steps=2, batch_size=4, collators="padded,flatten")
SECRET = "confidential-ledger-0815"


def private_file(folder: Path, name: str) -> Path:
    """A file no other upload has had (Gradio's upload folder keys files by content)."""
    path, marker = folder / name, uuid.uuid4().hex
    path.write_text("\n".join(json.dumps({"text": f"{SECRET} {marker} {i} " + "entry " * (4 + i % 7)})
                              for i in range(24)))
    return path


@pytest.fixture(scope="module")
def sharer(lab_app, tmp_path_factory) -> dict:
    """Visitor A: two private runs (uploads), the first shared."""
    folder = tmp_path_factory.mktemp("sharer")
    a = Client(lab_app.demo.local_url, verbose=False)
    runs = []
    for name in ("ledger-q1.jsonl", "ledger-q2.jsonl"):
        a.predict(**TINY, dataset_file=handle_file(str(private_file(folder, name))), api_name="/compare")
        runs.append(lab_app.HISTORY.entries()[-1])
    assert all(entry.private for entry in runs)
    link = a.predict(runs[0].run_id, api_name="/share")
    return {"client": a, "shared": runs[0], "other": runs[1], "link": link}


def test_a_shared_link_opens_a_copy_and_nothing_else_through_the_api(lab_app, sharer):
    a, shared, other, link = sharer["client"], sharer["shared"], sharer["other"], sharer["link"]
    token = link["token"]
    assert link == {"token": token, "query": f"?shared={token}", "run_id": shared.run_id} and len(token) >= 32
    b = Client(lab_app.demo.local_url, verbose=False)
    copy = b.predict(token, api_name="/shared")
    # The run's numbers, without the text of its uploaded data.
    assert [r["losses"] for r in copy["results"]] == [r["losses"] for r in shared.document["results"]]
    assert SECRET in json.dumps(shared.document) and SECRET not in json.dumps(copy)
    assert "examples" not in copy["dataset_stats"]
    # B lists neither of A's runs, opens neither by its id, and cannot share or revoke them.
    listed = json.dumps(b.predict(api_name="/history"))
    assert shared.run_id not in listed and other.run_id not in listed
    for run_id in (shared.run_id, other.run_id):
        with pytest.raises(Exception, match="no longer in the history"):
            b.predict(run_id, api_name="/run")
        with pytest.raises(Exception, match="no longer in the history"):
            b.predict(run_id, api_name="/share")
    with pytest.raises(Exception, match="only the browser tab or API client that shared"):
        b.predict(token, api_name="/unshare")
    with pytest.raises(Exception, match="revoked, or never existed"):  # a guessed token opens nothing
        b.predict(token[:-4] + "AAAA", api_name="/shared")
    assert a.predict(other.run_id, api_name="/run")["config"]["dataset"] == "ledger-q2.jsonl"  # A's own: its own
    # Only the token's hash is kept on the server.
    saved = [path.read_text() for path in lab_app.SHARES.folder.iterdir()]
    assert saved and not any(token in text for text in saved)


def test_a_revoked_link_opens_nothing(lab_app, sharer):
    a, shared = sharer["client"], sharer["shared"]
    token = a.predict(shared.run_id, api_name="/share")["token"]  # a second link of its own
    b = Client(lab_app.demo.local_url, verbose=False)
    assert b.predict(token, api_name="/shared")["results"]
    assert a.predict(token, api_name="/unshare") is True
    with pytest.raises(Exception, match="revoked, or never existed"):
        b.predict(token, api_name="/shared")
    assert b.predict(sharer["link"]["token"], api_name="/shared")["results"]  # the first link still opens


def _open(browser, url: str):
    """A page in a browser context of its own (another visitor)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(url)
    return context, page


@needs_chromium
def test_a_shared_link_opens_in_a_second_browser_context_and_shows_nothing_else(browser, lab_app, sharer):
    shared, other = sharer["shared"], sharer["other"]
    context, page = _open(browser, lab_app.demo.local_url + sharer["link"]["query"])
    page.wait_for_function("() => /shared with you/.test(document.querySelector('#headline')?.innerText ?? '')")
    page.wait_for_selector("#code-flatten textarea, #code-flatten .cm-content")
    assert shared.run_id in page.locator("#results-source").inner_text()
    table = page.locator("#results").inner_text()
    assert "padded" in table and "flatten" in table, table
    # Its scripts, each with copy and download buttons (the viewer draws the lines in view: the first ones)
    code = page.locator("#code-flatten")
    assert "flatten: the same examples in one row" in code.inner_text()
    assert code.get_by_role("button").count() >= 2
    # The copy has no uploaded text, and the page lists neither of the sharer's runs (nor anyone's private ones).
    page.wait_for_function("() => document.querySelector('#history tbody')")
    text = page.locator("body").inner_text()
    assert SECRET not in text and shared.run_id not in page.locator("#history").inner_text()
    assert other.run_id not in text and "ledger-q2" not in text
    assert "?shared=" in page.url and page.locator("#share-button").is_hidden()  # a copy is not shared again
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#code-intro").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "browser-shared-run.png"))
    context.close()
    # The sharer's other run by its own URL: in another context, no such run.
    context, page = _open(browser, f"{lab_app.demo.local_url}?run={other.run_id}")
    page.get_by_text("that run is no longer in the history").first.wait_for()
    assert other.run_id not in page.locator("body").inner_text()
    context.close()


@needs_chromium
def test_share_on_the_page_gives_a_link_that_its_owner_revokes(browser, lab_app, sharer):
    document = without_uploaded_text(sharer["shared"].document)
    document = {**document, "config": {**document["config"], "dataset": "flan-like"}}
    public = lab_app.HISTORY.append(document, owner=Session.of(  # a run everyone may see
        types.SimpleNamespace(session_hash="a past visitor")).key)
    owner_context, owner = _open(browser, f"{lab_app.demo.local_url}?run={public.run_id}")
    owner.wait_for_function("() => /from its link/.test(document.querySelector('#headline')?.innerText ?? '')")
    owner.click("#share-button")
    owner.wait_for_function("() => /[?]shared=/.test(document.querySelector('#run-link textarea, #run-link input')"
                            ".value)")
    link = owner.evaluate("() => document.querySelector('#run-link textarea, #run-link input').value")
    assert link.startswith(lab_app.demo.local_url) and f"?run={public.run_id}" in owner.url
    context, page = _open(browser, link)
    page.wait_for_function("() => /shared with you/.test(document.querySelector('#headline')?.innerText ?? '')")
    context.close()
    owner.click("#revoke-button")
    owner.wait_for_function("() => /Revoked/.test(document.querySelector('#status')?.innerText ?? '')")
    context, page = _open(browser, link)
    page.get_by_text("revoked, or never existed").first.wait_for()
    time.sleep(1)  # nothing arrives late: the headline never shows the run
    assert "shared with you" not in page.locator("#headline").inner_text()
    context.close()
    owner_context.close()
