"""The chat page's layout and conveniences in a real browser (Debian's headless Chromium):
phone width, the drawer, copy buttons, dark mode, timestamps, live search, the favicon and
the preset picker. No reply is generated: replies are seeded into the live server's
database, so these hold on any CPU (the seed only loads the tokenizer)."""

from __future__ import annotations

import json
import re
import urllib.request
from datetime import datetime

import pytest

from .chat_steps import new_chat, page_opener, wait_connected
from .conftest import ARTIFACTS

pytestmark = pytest.mark.model  # the seeded reply is tokenised with the real tokenizer

WAIT_MS = 60_000
PHONE = {"width": 390, "height": 844}
LONG_TITLE = "A very long conversation title " * 6 + "that ends here"  # 200 characters
REPLY = (
    "Here is **bold** text and a long line of code that must scroll inside its block:\n\n"
    "```python\nprint('hello')  # " + "x" * 120 + "\nprint('again')\n```\n"
)



@pytest.fixture(scope="module")
def user(chat_server):
    """A user with one conversation holding a finished, seeded reply."""
    user = chat_server.seed("users", "1", "ui")[0]
    chat_server.seed("reply", str(user["conversation_id"]), REPLY)
    return user


@pytest.fixture
def open_page(browser, chat_server, user):
    """open_page(path, **context options) -> a logged-in page; console errors collected."""
    with page_opener(browser, chat_server, user, WAIT_MS) as open_page:
        yield open_page


def conversation_path(user) -> str:
    return f"/c/{user['conversation_id']}/"


def stored_messages(server, user) -> list[dict]:
    req = urllib.request.Request(f"{server.url}{conversation_path(user)}messages.json",
                                 headers={"Cookie": f"sessionid={user['sessionid']}"})
    with urllib.request.urlopen(req, timeout=30) as response:
        return json.loads(response.read())["messages"]


def box_on_screen(page, selector: str) -> dict:
    """The element's box, asserted to lie inside the viewport."""
    el = page.locator(selector).first
    assert el.is_visible(), selector
    box = el.bounding_box()
    vw, vh = page.viewport_size["width"], page.viewport_size["height"]
    assert box["x"] >= 0 and box["x"] + box["width"] <= vw + 0.5, (selector, box)
    assert box["y"] >= 0 and box["y"] + box["height"] <= vh + 0.5, (selector, box)
    return box


def test_at_phone_width_nothing_overflows_and_the_sidebar_is_a_drawer(open_page, user):
    page = open_page(conversation_path(user))
    wait_connected(page)
    # A 200-character title, set as a user would.
    page.click(".manage summary")
    page.fill(".manage input[name=title]", LONG_TITLE)
    page.click(".manage .rename button")
    wait_connected(page)
    assert page.inner_text("#conversation-title") == LONG_TITLE

    page = open_page(conversation_path(user), viewport=PHONE)
    wait_connected(page)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-phone.png"))
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert page.evaluate("document.body.scrollWidth") <= PHONE["width"]
    for selector in ["#connection", ".manage summary", "#send", ".menu-button",
                     "article.msg.assistant .copy-reply"]:
        box_on_screen(page, selector)
    # The end of the usage line: the text wraps inside the screen, never past it.
    usage = page.locator("article.msg.assistant .usage")
    assert usage.is_visible()
    right = page.evaluate("""() => { const r = document.createRange();
        r.selectNodeContents(document.querySelector('article.msg.assistant .usage'));
        return Math.max(...Array.from(r.getClientRects(), b => b.right)); }""")
    assert right <= PHONE["width"]
    # The conversation has the height; the sidebar is out of the way until asked for.
    assert not page.locator("#new-chat").is_visible()
    assert page.locator("#messages").bounding_box()["height"] > PHONE["height"] * 0.6

    page.click(".menu-button")
    page.wait_for_function(
        "document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    assert page.get_attribute(".chat-header .menu-button", "aria-expanded") == "true"
    for selector in ["#new-chat", "#logout", "#preset-picker", "#search", "#theme-toggle",
                     f'[data-conversation-id="{user["conversation_id"]}"]']:
        box_on_screen(page, selector)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=str(ARTIFACTS / "chat-phone-drawer.png"))
    page.keyboard.press("Escape")
    page.wait_for_function("getComputedStyle(document.getElementById('sidebar'))"
                           ".visibility === 'hidden'")
    assert page.errors == []

    # The start page too: its header holds the menu button that opens the drawer.
    page = open_page("/", viewport=PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.click(".menu-button")
    page.wait_for_function(
        "document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    box_on_screen(page, "#new-chat")
    page.click("#drawer-close")
    page.wait_for_function("getComputedStyle(document.getElementById('sidebar'))"
                           ".visibility === 'hidden'")
    assert page.errors == []


def test_copy_buttons_copy_the_reply_and_the_code(open_page, chat_server, user):
    page = open_page(conversation_path(user))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"],
                                   origin=chat_server.url)
    wait_connected(page)
    reply = page.locator("article.msg.assistant").first
    copy = reply.locator("button.copy-reply")
    assert copy.get_attribute("aria-label") == "Copy reply"
    copy.click()
    page.wait_for_function("document.querySelector('.copy-reply').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == REPLY  # the raw Markdown

    code = reply.locator(".code-block button.copy-code")
    assert code.count() == 1 and code.get_attribute("aria-label") == "Copy code"
    code.click()
    page.wait_for_function("document.querySelector('.copy-code').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == (
        "print('hello')  # " + "x" * 120 + "\nprint('again')")
    # The code's text is only the code: the button sits outside the <pre>.
    assert "Copy" not in reply.locator("pre").inner_text()
    assert page.errors == []


def background_is_dark(page) -> bool:
    rgb = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
    r, g, b = (int(x) for x in re.findall(r"\d+", rgb)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) < 80


def test_dark_mode_follows_the_system_and_the_toggle_is_remembered(open_page, user):
    page = open_page(conversation_path(user), color_scheme="dark")
    wait_connected(page)
    assert background_is_dark(page)
    assert page.get_attribute("#theme-toggle", "aria-pressed") == "true"
    page.screenshot(path=str(ARTIFACTS / "chat-dark.png"))
    page.click("#theme-toggle")
    assert not background_is_dark(page)
    assert page.get_attribute("#theme-toggle", "aria-pressed") == "false"
    page.reload()
    wait_connected(page)
    assert not background_is_dark(page)  # the choice outlives the page
    page.screenshot(path=str(ARTIFACTS / "chat-light.png"))

    page = open_page(conversation_path(user), color_scheme="light")
    assert not background_is_dark(page)
    page.click("#theme-toggle")
    assert background_is_dark(page)
    page.goto(page.url)
    assert background_is_dark(page)
    assert page.evaluate("localStorage.getItem('prefixchat-theme')") == "dark"
    assert page.errors == []


@pytest.mark.parametrize(("locale", "pattern"), [
    ("en-US", "{h12}:{mm} {ampm}"),
    ("de-DE", "{hh}:{mm}"),
])
def test_messages_show_their_time_in_the_users_locale(open_page, chat_server, user, locale,
                                                      pattern):
    page = open_page(conversation_path(user), locale=locale, timezone_id="UTC")
    wait_connected(page)
    reply = stored_messages(chat_server, user)[-1]
    when = datetime.fromisoformat(reply["created_at"])
    shown = page.locator(f'article[data-id="{reply["id"]}"] time.msg-time')
    assert datetime.fromisoformat(shown.get_attribute("datetime")) == when
    expected = pattern.format(h12=when.hour % 12 or 12, hh=f"{when.hour:02d}",
                              mm=f"{when.minute:02d}", ampm="AM" if when.hour < 12 else "PM")
    # Intl may put a narrow no-break space before AM/PM.
    assert shown.inner_text().replace("\u202f", " ").endswith(expected)


def test_search_filters_the_list_as_you_type(open_page, chat_server, user):
    other = chat_server.seed("users", "1", "searcher")[0]
    chat_server.seed("reply", str(other["conversation_id"]), "Zebras are striped.")
    page = open_page("/")
    page.context.clear_cookies()
    page.context.add_cookies([{"name": "sessionid", "value": other["sessionid"],
                               "url": chat_server.url}])
    for _ in range(2):  # two more conversations that do not match
        page.goto(chat_server.url + "/")
        page.click("#new-chat")
        page.wait_for_url(re.compile(r"/c/\d+/$"))
    page.goto(chat_server.url + "/")
    links = page.locator("#conversation-list a")
    assert links.count() == 3
    page.click("#search")
    page.keyboard.type("zebra", delay=30)  # no Enter
    page.wait_for_selector('#conversation-list[data-query="zebra"]')
    assert links.count() == 1
    assert links.first.get_attribute("data-conversation-id") == str(other["conversation_id"])
    page.keyboard.type("s-and-more")
    page.wait_for_selector('#conversation-list[data-query="zebras-and-more"]')
    assert links.count() == 0
    assert "No conversation matches" in page.inner_text("#conversation-list")
    assert page.url.endswith("?q=zebras-and-more")  # a reload keeps the filter
    assert page.errors == []


def test_no_console_errors_and_the_favicon_answers(open_page, chat_server, user):
    for path in ["/", conversation_path(user)]:
        page = open_page(path)
        page.wait_for_load_state("networkidle")
        icon = page.get_attribute('link[rel="icon"]', "href")
        assert page.request.get(chat_server.url + icon).status == 200
        assert page.request.get(chat_server.url + "/favicon.ico").status == 200
        assert page.errors == [], path


def test_the_preset_picker_shows_the_open_conversations_preset_in_full(open_page, user):
    page = open_page("/")
    new_chat(page, "coding")
    assert page.input_value("#preset-picker") == "coding"
    page.goto(page.url.rsplit("/c/", 1)[0] + conversation_path(user))
    assert page.input_value("#preset-picker") == "general"
    # Every preset's title fits the picker (room left for its arrow).
    fits = page.evaluate("""() => {
        const select = document.getElementById('preset-picker');
        const ctx = document.createElement('canvas').getContext('2d');
        ctx.font = getComputedStyle(select).font;
        const widest = Math.max(...Array.from(select.options, o => ctx.measureText(o.text).width));
        return {widest, room: select.clientWidth - 28};
    }""")
    assert fits["widest"] <= fits["room"], fits
    for viewport in [PHONE]:
        page.set_viewport_size(viewport)
        page.click(".menu-button")
        page.wait_for_function(
            "document.getElementById('sidebar').getBoundingClientRect().left >= 0")
        assert page.locator("#preset-picker").bounding_box()["width"] > fits["widest"] + 28


def test_a_json_reply_and_a_tool_call_show_as_highlighted_json(open_page, chat_server):
    other = chat_server.seed("users", "1", "structured")[0]
    cid = str(other["conversation_id"])
    chat_server.seed("reply", cid, '{"city": "Paris", "population": 2102650}')
    chat_server.seed("reply", cid, 'Checking.\n<tool_call>\n{"name": "get_weather", '
                                   '"arguments": {"city": "Paris"}}\n</tool_call>')
    page = open_page(f"/c/{cid}/")
    page.context.clear_cookies()
    page.context.add_cookies([{"name": "sessionid", "value": other["sessionid"],
                               "url": chat_server.url}])
    page.goto(f"{chat_server.url}/c/{cid}/")
    wait_connected(page)
    first, second = page.locator("article.msg.assistant .msg-body").all()[:2]
    code = first.locator("pre code.language-json")
    assert code.count() == 1 and '"population": 2102650' in code.inner_text()
    assert code.locator(".hljs-attr").count() >= 2  # highlighted, keys marked
    assert "Tool call" in second.inner_text()
    assert '"name": "get_weather"' in second.locator("pre code.language-json").inner_text()
    assert "<tool_call>" not in second.inner_text()
