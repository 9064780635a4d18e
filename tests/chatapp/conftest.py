"""Users and the browser shared by the chat-service tests."""

import pytest


@pytest.fixture(autouse=True)
def no_model_titles(settings):
    """Titles the model writes are off unless a test turns them on: they rename the
    conversations other tests look for, and would run on after a test's reply."""
    settings.CHAT_TITLES = False


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="alice-pass-123")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password="bob-pass-123")


# Debian's Chromium, driven by Playwright (which never downloads a browser here).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
