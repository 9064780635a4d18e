"""A conversation longer than its context on the chat page, in a real browser against a
live server whose chats hold 384 tokens: every turn answers, and a divider stands right
above the first message the model still sees; everything above it stays on the page."""

from __future__ import annotations

import pytest

from .chat_steps import chat, logged_in_page, new_chat
from .conftest import ARTIFACTS, start_live_server, stop_live_server
from .test_browser import PASSWORD, replies, stored

pytestmark = pytest.mark.model

WAIT_MS = 180_000
QUESTIONS = (
    "Which colour do you get when you mix blue and yellow paint together on a palette?",
    "Name one animal that lives in the sea and one that lives in the desert, please.",
    "What is the capital of France, and which river runs through the middle of it?",
)
TURNS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live, proc = start_live_server(tmp_path_factory.mktemp("cut-live"), "cut",
                                   CHAT_CONTEXT_TOKENS="384", CHAT_MAX_NEW_TOKENS="8")
    live.user = live.seed("users", "1", "cutter", PASSWORD)[0]
    yield live
    stop_live_server(proc)


@pytest.fixture
def page(browser, server):
    with logged_in_page(browser, server, PASSWORD, WAIT_MS) as page:
        yield page


def divider_then(page) -> tuple[int, str | None]:
    """(how many messages stand above the divider, the id of the one right below it)."""
    return page.evaluate("""() => {
        const kids = Array.from(document.querySelectorAll('#messages > *'));
        const at = kids.findIndex((el) => el.classList.contains('history-cut'));
        if (at < 0) return [-1, null];
        return [at, kids[at + 1] ? kids[at + 1].dataset.id : null];
    }""")


def test_the_divider_stands_above_the_first_message_the_model_sees(page, server):
    conversation = new_chat(page)
    chat(page, [f"{n + 1}. {QUESTIONS[n % len(QUESTIONS)]}" for n in range(TURNS)])
    data = stored(server, page, conversation)
    messages = {m["id"]: m for m in data["messages"]}
    last = max((m for m in data["messages"] if m["role"] == "assistant"), key=lambda m: m["id"])
    cut = last["usage"]["prefix_cache"]["history_cut"]
    first_seen = cut["first_message_id"]
    assert messages[first_seen]["role"] == "user"

    assert page.locator(".history-cut").count() == 1
    assert page.locator(".history-cut").inner_text() == (
        "The assistant no longer sees the messages above")
    above, below = divider_then(page)
    # Whole turns above it, every one still shown; the first message it sees right below.
    assert above == cut["messages"] == 2 * cut["turns"] and int(below) == first_seen
    assert page.locator("article.msg").count() == 2 * TURNS
    # The reply whose prompt made a cut says so in its receipt.
    usages = replies(page).locator(".usage").all_inner_texts()
    assert any("history cut at turn" in text for text in usages), usages
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".history-cut").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "chat-history-cut.png"))

    # Drawn from what is stored: a reload puts it in the same place.
    page.reload()
    page.wait_for_selector(".history-cut")
    assert divider_then(page) == [above, below]
