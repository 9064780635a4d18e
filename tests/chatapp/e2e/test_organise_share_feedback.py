"""The chat page's organisation in Chromium: pin, archive and restore, and the tag filter
of the sidebar. One live server and one user for the module; replies are seeded, so
nothing here waits for the model."""

from __future__ import annotations

import pytest

from .chat_steps import wait_connected
from .conftest import ARTIFACTS

pytestmark = pytest.mark.model  # the seeded reply is tokenised with the real tokenizer

WAIT_MS = 60_000


@pytest.fixture(scope="module")
def user(chat_server):
    """A user with one conversation holding a finished, seeded reply."""
    user = chat_server.seed("users", "1", "organiser")[0]
    chat_server.seed("reply", str(user["conversation_id"]), "Paris is the capital of France.")
    return user


@pytest.fixture(scope="module")
def page(browser, chat_server, user):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_cookies([{"name": "sessionid", "value": user["sessionid"],
                          "url": chat_server.url}])
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.errors = []
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


def sidebar_titles(page) -> list[str]:
    return page.eval_on_selector_all("#conversation-list a .title",
                                     "els => els.map(e => e.textContent)")


def wait_for_list(page, predicate: str) -> None:
    """Wait until the sidebar's titles satisfy `predicate` (JS over `t`, the titles)."""
    page.wait_for_function(
        "() => { const t = Array.from(document.querySelectorAll('#conversation-list a .title'),"
        " e => e.textContent); return " + predicate + "; }")


def test_pin_archive_restore_and_filter_by_tag(page, chat_server, user):
    page.goto(f"{chat_server.url}/c/{user['conversation_id']}/")
    wait_connected(page)
    # A second conversation, made as a user would: the newest, so first in the list.
    page.click("#new-chat")
    page.wait_for_url(f"{chat_server.url}/c/*/")
    wait_connected(page)
    page.goto(f"{chat_server.url}/c/{user['conversation_id']}/")
    wait_connected(page)
    titles = sidebar_titles(page)
    assert len(titles) == 2 and titles[1] == "Show me some HTML."

    # Pin the older one: it heads the list.
    page.click("#conversation-menu")
    page.click("#pin-conversation")
    page.wait_for_selector("#pin-conversation:text('Unpin')")
    wait_for_list(page, "t[0] === 'Show me some HTML.'")
    assert page.locator("#conversation-list li.pinned").count() == 1

    # Tag it; the tag filter offers the tag and shows only that conversation.
    page.fill("#tags-input", "travel, geography")
    page.click("#tags-form button")
    page.wait_for_selector("#tag-filter option[value=travel]", state="attached")
    page.select_option("#tag-filter", "travel")
    wait_for_list(page, "t.length === 1 && t[0] === 'Show me some HTML.'")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-organise-tags.png"))
    page.select_option("#tag-filter", "")
    wait_for_list(page, "t.length === 2")

    # Archive it: out of the list, shown by the Archived filter, and by a search.
    page.click("#archive-conversation")
    page.wait_for_selector("#archive-conversation:text('Restore')")
    wait_for_list(page, "t.length === 1")
    page.check("#archived-filter")
    wait_for_list(page, "t.length === 1 && t[0] === 'Show me some HTML.'")
    page.uncheck("#archived-filter")
    wait_for_list(page, "t.length === 1 && t[0] !== 'Show me some HTML.'")
    page.fill("#search", "HTML")
    wait_for_list(page, "t.length === 1 && t[0] === 'Show me some HTML.'")
    page.fill("#search", "")
    # Restore it: back in the list, still pinned first.
    page.click("#archive-conversation")
    page.wait_for_selector("#archive-conversation:text('Archive')")
    wait_for_list(page, "t.length === 2 && t[0] === 'Show me some HTML.'")
    assert page.errors == []
