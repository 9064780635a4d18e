"""The chat page's settings panel in a real browser (Debian's headless Chromium) on the
live server with the real model: a system prompt and a temperature written for a chat,
saved as a personal preset, a second chat started on it whose first turn reports the
system segment cached; the header's model and preset and the panel at phone width."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

from .chat_steps import chat, new_chat, page_opener
from .conftest import ARTIFACTS

pytestmark = pytest.mark.model

WAIT_MS = 120_000
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def user(chat_server):
    return chat_server.seed("users", "1", "settings")[0]


@pytest.fixture
def open_page(browser, chat_server, user):
    with page_opener(browser, chat_server, user, WAIT_MS, console_errors=False) as open_page:
        yield open_page


def get_json(server, user, path: str) -> dict:
    req = urllib.request.Request(server.url + path,
                                 headers={"Cookie": f"sessionid={user['sessionid']}"})
    with urllib.request.urlopen(req, timeout=30) as response:
        return json.loads(response.read())


def inside_viewport(page, selector: str) -> None:
    box = page.locator(selector).first.bounding_box()
    vw, vh = page.viewport_size["width"], page.viewport_size["height"]
    assert box is not None, selector
    assert box["x"] >= 0 and box["x"] + box["width"] <= vw + 0.5, (selector, box)
    assert box["y"] >= 0 and box["y"] + box["height"] <= vh + 0.5, (selector, box)


def test_a_preset_saved_from_one_chat_starts_another_that_hits_its_system_blocks(
        open_page, chat_server, user):
    page = open_page()
    first_id = new_chat(page)
    system = f"You are Quill {uuid.uuid4().hex[:8]}, a terse assistant. Answer in one short sentence."
    page.click("#chat-settings-toggle")
    page.fill("#setting-system-prompt", system)
    page.fill("#setting-temperature", "0")
    page.fill("#setting-max-new-tokens", "8")
    page.click("#settings-apply")
    page.wait_for_selector("#settings-status:has-text('Saved')")
    page.fill("#preset-name", "Quill")
    page.click("#preset-save")
    page.wait_for_selector("#settings-status:has-text('Saved as')")
    assert page.inner_text("#conversation-preset") == "Quill"
    page.screenshot(path=str(ARTIFACTS / "chat-settings-panel.png"))
    first = get_json(chat_server, user, f"/api/conversations/{first_id}/settings/")
    assert (first["system_prompt"], first["temperature"], first["max_new_tokens"]) == (system, 0, 8)

    page.click("#chat-settings-toggle")  # closed
    chat(page, ["Name a colour."])

    # The new-chat picker offers the preset; the second chat's first turn finds the
    # system segment already computed by the first chat.
    page.select_option("#preset-picker", label="Quill")
    second_id = new_chat(page)
    assert second_id != first_id
    assert page.inner_text("#conversation-preset") == "Quill"
    second = get_json(chat_server, user, f"/api/conversations/{second_id}/settings/")
    assert (second["system_prompt"], second["temperature"]) == (system, 0)
    chat(page, ["Name an animal."])
    reply = get_json(chat_server, user, f"/c/{second_id}/messages.json")["messages"][-1]
    usage = reply["usage"]
    assert usage["prefix_cache"]["reason"] == "full", usage
    assert usage["cached_tokens"] >= 16 and usage["cached_tokens"] % 16 == 0
    assert usage["completion_tokens"] <= 8
    assert "cache full" in page.inner_text("article.msg.assistant .usage")
    assert not page.errors


def test_at_phone_width_the_header_shows_model_and_preset_and_the_panel_fits(
        open_page, chat_server, user):
    page = open_page("/", viewport=PHONE)
    page.click(".menu-button")  # the conversation list is a drawer at phone width
    new_chat(page)
    inside_viewport(page, "#conversation-model")
    inside_viewport(page, "#conversation-preset")
    assert page.inner_text("#conversation-model") and page.inner_text("#conversation-preset")
    page.click("#chat-settings-toggle")
    page.wait_for_selector("#settings-form", state="visible")
    inside_viewport(page, "#settings-form")
    for selector in ("#setting-system-prompt", "#setting-temperature", "#setting-max-new-tokens",
                     "#settings-apply", "#preset-save"):
        inside_viewport(page, selector)
    # Nothing scrolls sideways.
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=str(ARTIFACTS / "chat-settings-phone.png"))
    assert not page.errors
