"""Titles the model writes, on the chat page in a real browser against a live server:
after the first reply the header, the tab and the conversation list take the model's
title without a reload, and the socket brought the reply's message.done first."""

from __future__ import annotations

import json

import pytest

from chatapp.chat.services import auto_title

from .chat_steps import logged_in_page, new_chat, send, wait_for_final
from .conftest import ARTIFACTS, start_live_server, stop_live_server
from .test_browser import PASSWORD

pytestmark = pytest.mark.model

WAIT_MS = 180_000
QUESTION = "Which colour do you get when you mix blue and yellow paint together?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live, proc = start_live_server(tmp_path_factory.mktemp("titles-live"), "titles",
                                   CHAT_TITLES="1", CHAT_MAX_NEW_TOKENS="16")
    live.user = live.seed("users", "1", "titler", PASSWORD)[0]
    yield live
    stop_live_server(proc)


@pytest.fixture
def page(browser, server):
    with logged_in_page(browser, server, PASSWORD, WAIT_MS) as page:
        yield page


def test_the_model_titles_the_chat_after_its_first_reply(page):
    events: list[str] = []

    def listen(ws) -> None:
        ws.on("framereceived", lambda frame: events.append(json.loads(frame)["type"]))

    page.on("websocket", listen)
    conversation = new_chat(page)
    send(page, QUESTION)
    wait_for_final(page, 0)
    first = f"#conversation-list [data-conversation-id='{conversation}'] .title"
    # Until the title arrives the chat is named after its first message; then the header,
    # the tab and the list entry all take the model's title.
    page.wait_for_function(
        "(q) => { const h = document.getElementById('conversation-title').textContent;"
        " return h && h !== q && h !== 'New conversation'; }", arg=auto_title(QUESTION))
    title = page.inner_text("#conversation-title")
    assert page.inner_text(first) == title
    assert page.title().startswith(title)
    assert events.index("message.done") < events.index("conversation.title")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-title.png"))
    # It is stored: a reload shows it.
    page.reload()
    page.wait_for_selector("#conversation-title")
    assert page.inner_text("#conversation-title") == title
