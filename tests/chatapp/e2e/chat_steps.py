"""What a person does on the chat page, as Playwright steps the browser tests share."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

REPLY_WITH_STATUS = (
    "([i, s]) => { const el = document.querySelectorAll('article.msg.assistant')[i];"
    " return el && s.includes(el.dataset.status); }"
)


def new_chat(page, preset: str | None = None, model: str | None = None) -> int:
    """Start a conversation (with the preset and model picked, where given) and wait for
    its socket; the conversation's id."""
    if preset is not None:
        page.select_option("#preset-picker", preset)
    if model is not None:
        page.select_option("#model-picker", model)
    page.click("#new-chat")
    page.wait_for_url(re.compile(r"/c/\d+/$"))
    wait_connected(page)
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def wait_connected(page) -> None:
    """Wait until the page's WebSocket is open."""
    page.wait_for_selector('#connection[data-state="open"]')


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def wait_for_final(page, index: int, statuses: tuple[str, ...] = ("done",)) -> None:
    """Wait until reply `index` of the page has one of `statuses`."""
    page.wait_for_function(REPLY_WITH_STATUS, arg=[index, list(statuses)])


def chat(page, messages: list[str] | tuple[str, ...], first: int = 0) -> None:
    """Send each message and wait for its reply (the page's reply `first` onwards)."""
    for i, text in enumerate(messages, start=first):
        send(page, text)
        wait_for_final(page, i)


def log_in(page, url: str, username: str, password: str) -> None:
    """Sign in on the login page at url and wait for the chat page."""
    page.goto(url + "/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("#new-chat")


@contextmanager
def logged_in_page(browser, server, password: str, timeout_ms: int) -> Iterator:
    """A 1280x900 page in a new browser context, signed in as server.user through the
    login page; the context is closed on leaving."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(timeout_ms)
    try:
        log_in(page, server.url, server.user["username"], password)
        yield page
    finally:
        context.close()


def signed_in_page(browser, server, user: dict, timeout_ms: int, *,
                   console_errors: bool = True, **options):
    """A page in a new browser context (1280x900 unless `options` say otherwise) that
    carries `user`'s session cookie. page.errors collects its uncaught errors and, unless
    console_errors is False, what it logs as console errors. Closing page.context ends it."""
    options.setdefault("viewport", {"width": 1280, "height": 900})
    context = browser.new_context(**options)
    context.add_cookies([{"name": "sessionid", "value": user["sessionid"],
                          "url": server.url}])
    page = context.new_page()
    page.set_default_timeout(timeout_ms)
    page.errors = []
    if console_errors:
        page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    return page


@contextmanager
def page_opener(browser, server, user: dict, timeout_ms: int, *,
                console_errors: bool = True) -> Iterator[Callable]:
    """open_page(path, **context options) -> a signed_in_page at `path`; every context it
    opened is closed on leaving."""
    pages = []

    def open_page(path: str = "/", **options):
        page = signed_in_page(browser, server, user, timeout_ms,
                              console_errors=console_errors, **options)
        pages.append(page)
        page.goto(server.url + path)
        return page

    try:
        yield open_page
    finally:
        for page in pages:
            page.context.close()
