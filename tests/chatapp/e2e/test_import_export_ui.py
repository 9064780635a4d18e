"""Import and export from the chat page in Chromium: a ChatGPT export file with a branch,
chosen with the sidebar's import button, opens as a conversation in the sidebar with ‹ ›
between the branch's siblings; the conversation menu downloads it as JSON. A file that
cannot be read shows the API's reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chatapp.api.import_files import chatgpt_with_branch

from .chat_steps import wait_connected
from .conftest import ARTIFACTS

pytestmark = pytest.mark.model  # the live server loads the model

WAIT_MS = 60_000


@pytest.fixture(scope="module")
def page(browser, chat_server):
    user = chat_server.seed("users", "1", "importer")[0]
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.add_cookies([{"name": "sessionid", "value": user["sessionid"],
                          "url": chat_server.url}])
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


def test_import_a_chatgpt_file_with_a_branch_and_export_it_as_json(page, chat_server, tmp_path):
    page.goto(f"{chat_server.url}/")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"title": "no mapping"}]))
    page.set_input_files("#import-file", str(bad))
    page.wait_for_selector("#import-error:not([hidden])")
    assert "mapping" in page.text_content("#import-error")

    good = tmp_path / "conversations.json"
    good.write_text(json.dumps([chatgpt_with_branch("Imported capitals")]))
    page.set_input_files("#import-file", str(good))
    page.wait_for_url(f"{chat_server.url}/c/*/")
    wait_connected(page)
    titles = page.eval_on_selector_all("#conversation-list a .title",
                                       "els => els.map(e => e.textContent)")
    assert "Imported capitals" in titles
    # The branch on screen is the file's current node; ‹ › lead to its sibling.
    page.wait_for_selector("#messages article.msg:has-text('RIGHT answer')")
    page.wait_for_selector(".sibling-label:text('2 / 2')")
    page.click(".sibling-prev")
    page.wait_for_selector("#messages article.msg:has-text('LEFT answer')")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-imported-branch.png"))

    page.click("#conversation-menu")
    with page.expect_download() as info:
        page.click("#export-json")
    path = info.value.path()
    exported = json.loads(Path(path).read_text(encoding="utf-8"))
    texts = json.dumps(exported)
    assert "Imported capitals" in texts and "LEFT answer" in texts and "RIGHT answer" in texts
    assert info.value.suggested_filename.endswith(".json")
    assert not page.errors
