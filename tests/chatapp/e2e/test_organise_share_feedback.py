"""The chat page's organisation and feedback in Chromium: pin, archive and restore, the
sidebar's tag filter, thumbs and comments on a reply, a share link opened by a visitor and
revoked. One live server and one user for the module; replies are seeded, so
nothing here waits for the model."""

from __future__ import annotations

import pytest

from .chat_steps import signed_in_page, wait_connected
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
    page = signed_in_page(browser, chat_server, user, WAIT_MS)
    yield page
    page.context.close()


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


def test_thumbs_and_a_comment_on_a_reply_are_stored_and_shown_again(page, chat_server, user):
    page.goto(f"{chat_server.url}/c/{user['conversation_id']}/")
    wait_connected(page)
    reply = page.locator("article.msg.assistant").first
    reply.locator(".feedback-up").click()
    reply.locator(".feedback-comment input").fill("Short and right.")
    reply.locator(".feedback-comment button").click()
    page.wait_for_selector('article.msg.assistant .feedback[data-comment="Short and right."]')
    # Changed to a thumbs down, the comment kept; the page shows it after a reload.
    reply.locator(".feedback-down").click()
    page.wait_for_selector('article.msg.assistant .feedback[data-rating="down"]')
    page.reload()
    wait_connected(page)
    reply = page.locator("article.msg.assistant").first
    assert reply.locator(".feedback-down").get_attribute("aria-pressed") == "true"
    assert reply.locator(".feedback-up").get_attribute("aria-pressed") == "false"
    assert reply.locator(".feedback-comment input").input_value() == "Short and right."
    page.screenshot(path=str(ARTIFACTS / "chat-feedback.png"))
    # Pressing the pressed thumb takes it back.
    reply.locator(".feedback-down").click()
    page.wait_for_selector('article.msg.assistant .feedback[data-rating=""]')
    assert page.errors == []


def test_a_share_link_opens_without_a_login_and_stops_when_revoked(page, browser, chat_server,
                                                                    user):
    page.goto(f"{chat_server.url}/c/{user['conversation_id']}/")
    wait_connected(page)
    page.click("#conversation-menu")
    page.click("#share-create")
    page.wait_for_selector("#share-link:not([hidden])")
    link = page.input_value("#share-url")
    assert "/s/" in link

    # A visitor with no account reads the branch, without the owner's name.
    visitor = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        shared = visitor.new_page()
        assert shared.goto(link).status == 200
        assert "Paris is the capital of France." in shared.inner_text("#messages")
        assert user["username"] not in shared.content()
        shared.screenshot(path=str(ARTIFACTS / "chat-shared-page.png"))

        page.click("#share-revoke")
        page.wait_for_selector("#share-link", state="hidden")
        assert shared.goto(link).status == 404
    finally:
        visitor.close()
    assert page.errors == []
