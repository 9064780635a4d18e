"""The chat page in a real browser (Debian's headless Chromium via Playwright) against
a live daphne server with the real engine."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from .chat_steps import log_in, new_chat, send, wait_connected, wait_for_final
from .conftest import ARTIFACTS

pytestmark = pytest.mark.model

WAIT_MS = 180_000  # bounds a hung test; replies on two busy cores can be slow
PASSWORD = "browser-pass-123"
USAGE = re.compile(r"prompt (\d+) · cached (\d+) · completion (\d+) · TTFT (\d+) ms")
XSS = (
    "Here is HTML:\n\n<script>window.__pwned = 'script'</script>\n\n"
    "<img src=x onerror=\"window.__pwned = 'img'\">\n\n"
    "<a href=\"javascript:window.__pwned='link'\">click</a>\n\n"
    "```html\n<script>window.__pwned = 'code'</script>\n```\n"
)


@pytest.fixture(scope="module")
def server(chat_server):
    chat_server.user = chat_server.seed("users", "1", "walker", PASSWORD)[0]
    return chat_server



@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    log_in(page, server.url, server.user["username"], PASSWORD)
    yield page
    context.close()


def replies(page):
    return page.locator("article.msg.assistant")


def wait_for_streaming_text(page, index: int) -> None:
    """Wait until reply `index` shows part of its text while still streaming."""
    page.wait_for_function(
        """(i) => {
            const el = document.querySelectorAll('article.msg.assistant')[i];
            return el && el.dataset.status === 'streaming'
                && el.querySelector('.msg-body').textContent.trim().length > 0;
        }""",
        arg=index,
        polling="raf",
    )


def usage(page, index: int) -> dict:
    text = replies(page).nth(index).locator(".usage").inner_text()
    m = USAGE.search(text)
    assert m, text
    return dict(zip(["prompt", "cached", "completion", "ttft"], map(int, m.groups()), strict=True))


def stored(server, page, conversation_id: int) -> dict:
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    req = urllib.request.Request(
        f"{server.url}/c/{conversation_id}/messages.json",
        headers={"Cookie": f"sessionid={cookies['sessionid']}"},
    )
    with urllib.request.urlopen(req, timeout=30) as response:
        return json.loads(response.read())


def test_chat_streams_reuses_the_cache_and_stops(page, server):
    conversation_id = new_chat(page, "general")

    # Shift+Enter is a new line, Enter sends.
    page.click("#input")
    page.keyboard.type("Say hello")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("in one short sentence.")
    assert page.input_value("#input") == "Say hello\nin one short sentence."
    page.keyboard.press("Enter")
    wait_for_streaming_text(page, 0)
    wait_for_final(page, 0)
    assert page.locator("article.msg.user .msg-body").first.inner_text() == (
        "Say hello\nin one short sentence."
    )
    first = usage(page, 0)
    assert first["prompt"] > 0 and first["completion"] > 0

    send(page, "Now say goodbye.")
    wait_for_final(page, 1)
    second = usage(page, 1)
    assert second["cached"] >= (first["prompt"] // 16) * 16 > 0
    # The usage line carries the reply's cache receipt: the second turn reused it all.
    assert "cache full" in replies(page).nth(1).locator(".usage").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-page.png"), full_page=True)

    # A reply of hundreds of tokens (the live server allows 512), so the stop
    # lands long before it could end. Greedy replies follow the CPU's rounding: a prompt
    # that this small model may answer in one line ("count to 300") makes the test a race.
    send(page, "Write a long story about a dragon who learns to cook.")
    wait_for_streaming_text(page, 2)
    page.click("#stop")
    wait_for_final(page, 2, statuses=("stopped", "done"))
    assert replies(page).nth(2).get_attribute("data-status") == "stopped", (
        f"the reply ended before the stop reached the server: {usage(page, 2)}"
    )
    assert replies(page).nth(2).locator(".stopped-note").is_visible()
    assert page.locator("#send").is_visible() and not page.locator("#stop").is_visible()
    saved = stored(server, page, conversation_id)["messages"]
    assert [m["status"] for m in saved if m["role"] == "assistant"] == ["done", "done", "stopped"]
    assert saved[-1]["usage"]["completion_tokens"] < 64


def test_regenerate_and_edit_make_branches_to_switch_between(page, server):
    new_chat(page, "general")
    send(page, "Name one colour.")
    wait_for_final(page, 0)
    original = replies(page).nth(0).locator(".msg-body").inner_text()

    replies(page).nth(0).locator("button.regenerate").click()
    page.wait_for_selector("article.msg.assistant .sibling-label >> text='2 / 2'")
    wait_for_final(page, 0)
    replies(page).nth(0).locator("button.sibling-prev").click()
    assert replies(page).nth(0).locator(".sibling-label").inner_text() == "1 / 2"
    assert replies(page).nth(0).locator(".msg-body").inner_text() == original

    page.locator("article.msg.user button.edit").click()
    page.fill(".edit-form textarea", "Name one animal.")
    page.click(".edit-form button[type=submit]")
    page.wait_for_selector("article.msg.user .sibling-label >> text='2 / 2'")
    wait_for_final(page, 0)
    assert page.locator("article.msg.user .msg-body").inner_text() == "Name one animal."
    page.locator("article.msg.user button.sibling-prev").click()
    assert page.locator("article.msg.user .msg-body").inner_text() == "Name one colour."


def test_model_html_never_executes(page, server):
    conversation_id = new_chat(page, "general")
    server.seed("reply", str(conversation_id), XSS)
    page.reload()
    wait_connected(page)
    # And a live reply asked to echo the same payload (the model may or may not comply).
    send(page, "Repeat exactly: <script>window.__pwned='live'</script>"
               "<img src=x onerror=\"window.__pwned='live-img'\">")
    wait_for_final(page, 1)

    body = replies(page).nth(0).locator(".msg-body")
    assert "Here is HTML" in body.inner_text()
    assert "window.__pwned = 'code'" in body.locator("pre code").inner_text()
    assert page.evaluate("window.__pwned") is None
    assert page.dialogs == []
    assert page.locator(".msg-body script").count() == 0
    assert page.locator(".msg-body [onerror]").count() == 0
    assert page.locator('.msg-body a[href^="javascript"]').count() == 0


def test_a_message_over_the_context_is_refused_and_a_failed_reply_shows_its_error(page, server):
    conversation_id = new_chat(page, "general")
    # Over 8192 tokens: the message alone cannot fit the model's context.
    words = " ".join(f"w{i}" for i in range(12000))
    send(page, words)
    page.wait_for_selector("#notice:not([hidden])")
    assert "context holds 8192" in page.locator("#notice").inner_text()
    assert stored(server, page, conversation_id)["messages"] == []  # nothing stored

    # A reply that failed once started shows its error and offers Regenerate.
    server.seed("failed", str(conversation_id), "Generation failed inside the engine.")
    page.reload()
    wait_for_final(page, 0, statuses=("error",))
    error = replies(page).nth(0).locator(".msg-error")
    assert error.is_visible() and "Generation failed" in error.inner_text()
    assert replies(page).nth(0).locator("button.regenerate").is_visible()


def test_an_interrupted_reply_shows_as_such_and_continue_resumes_it(page, server):
    conversation_id = new_chat(page, "general")
    server.seed("interrupted", str(conversation_id), "Here are three colours: red,")
    page.reload()
    wait_connected(page)
    reply = replies(page).nth(0)
    assert reply.get_attribute("data-status") == "interrupted"
    assert "interrupted" in reply.locator(".stopped-note").inner_text()
    assert reply.locator("button.regenerate").is_visible()
    reply.locator("button.continue").click()
    wait_for_final(page, 0, statuses=("done",))
    text = replies(page).nth(0).locator(".msg-body").inner_text()
    assert text.startswith("Here are three colours: red,") and len(text) > 30
    saved = stored(server, page, conversation_id)["messages"]
    assert saved[-1]["status"] == "done" and saved[-1]["content"].startswith("Here are")


def test_a_closed_tab_does_not_stop_the_reply_and_reopening_resumes_it(page, server):
    """Only Stop stops a reply: closed mid-reply, it goes on (persisted as it streams);
    the conversation opened again shows the text so far and streams on from the next
    seq, with no gap and no repeat, to the whole reply."""
    conversation_id = new_chat(page, "general")
    send(page, "Write a long story about a dragon who learns to cook.")
    wait_for_streaming_text(page, 0)
    context = page.context
    page.close()

    def persisted() -> dict:
        return stored(server, again, conversation_id)["messages"][-1]

    again = context.new_page()
    again.set_default_timeout(WAIT_MS)
    frames: list[dict] = []
    again.on("websocket", lambda ws: ws.on(
        "framereceived", lambda payload: frames.append(json.loads(payload))))
    # With no page open, the reply goes on: its stored text grows from one heartbeat to
    # the next.
    first = persisted()
    assert first["status"] == "streaming", first
    while (later := persisted())["status"] == "streaming" and len(later["content"]) <= len(
            first["content"]):
        again.wait_for_timeout(200)
    assert len(later["content"]) > len(first["content"])

    again.goto(f"{server.url}/c/{conversation_id}/")
    wait_connected(again)
    wait_for_final(again, 0, statuses=("done",))
    saved = persisted()
    assert saved["status"] == "done" and saved["usage"]["completion_tokens"] > 0
    events = [f for f in frames if f.get("message_id") == saved["id"]]
    resumed = next(e for e in events if e["type"] == "message.resumed")
    assert resumed["text"], "the reopened page got no text so far"
    after = [e for e in events if e["type"] == "message.delta" and e["seq"] > resumed["seq"]]
    assert [d["seq"] for d in after] == list(range(resumed["seq"] + 1,
                                                   resumed["seq"] + 1 + len(after)))
    done = events[-1]
    assert done["type"] == "message.done" and done["seq"] == resumed["seq"] + len(after) + 1
    assert resumed["text"] + "".join(d["text"] for d in after) == saved["content"]
    shown = replies(again).nth(0).locator(".msg-body").inner_text()
    assert shown.split()[:5] == saved["content"].split()[:5]
