"""The screenshots in docs/img/, taken from a live server in Debian's headless Chromium.

    .venv/bin/python -m tests.chatapp.e2e.screenshots [--out docs/img] [--check-api]

Starts daphne as the browser tests do (its own SQLite file, the default model), has a
user chat as a new user would (two real turns in a coding conversation, so the second
reply shows its cache receipt; two more conversations for the sidebar), and saves the
chat page in light and dark mode, at phone width, and the admin's cache dashboard, as
palette PNGs small enough to keep in git. With --check-api it also runs the README's
OpenAI SDK example against the same server and prints its cached tokens.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import tempfile
from pathlib import Path

from . import chat_steps as steps
from .conftest import PYTHON, ROOT, start_live_server, stop_live_server

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
WAIT_MS = 180_000
DESKTOP = {"width": 1200, "height": 760}
PHONE = {"width": 390, "height": 844}
PASSWORD = "screenshot-pass-1"
CHATS = [  # (preset, messages): the last one is the one shown
    ("support", ["My order has not arrived yet. What can I do?"]),
    ("general", ["What is the capital of France?"]),
    ("coding", ["Write one line of Python that reverses the string s.",
                "What does [::-1] mean?"]),
]


def manage(server, *args: str) -> str:
    out = subprocess.run([PYTHON, "manage.py", *args], env=server.env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout


def save(page, path: Path) -> None:
    """A palette PNG (256 colours): UI screenshots lose nothing visible, and shrink 3-4x."""
    from PIL import Image

    image = Image.open(io.BytesIO(page.screenshot()))
    image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
        path, optimize=True)
    print(f"{path}: {path.stat().st_size // 1024} KiB")


def chat(page, preset: str, messages: list[str]) -> None:
    steps.new_chat(page, preset)
    steps.chat(page, messages)


def check_api(server) -> None:
    from openai import OpenAI

    out = manage(server, "create_api_key", "--user", "demo0", "--name", "readme")
    key = out.strip().splitlines()[-1]
    client = OpenAI(base_url=server.url + "/v1", api_key=key)
    # The README's example, as written there.
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is a KV cache?"}]
    done = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages)
    messages += [done.choices[0].message, {"role": "user", "content": "And prefix caching?"}]
    done = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages)
    print("README example: cached_tokens", done.usage.prompt_tokens_details.cached_tokens,
          "of", done.usage.prompt_tokens)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--check-api", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server, proc = start_live_server(Path(tmp), "screenshots", CHAT_MAX_NEW_TOKENS="96")
        try:
            user = server.seed("users", "1", "demo", PASSWORD)[0]
            # An admin, for the dashboard; without the empty conversation the seed made.
            manage(server, "shell", "-c",
                   "from django.contrib.auth.models import User; "
                   "from chatapp.chat.models import Conversation; "
                   "User.objects.filter(username='demo0').update(is_staff=True, is_superuser=True); "
                   f"Conversation.objects.filter(pk={user['conversation_id']}).delete()")
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                context = browser.new_context(viewport=DESKTOP, color_scheme="light")
                context.add_cookies([{"name": "sessionid", "value": user["sessionid"],
                                      "url": server.url}])
                page = context.new_page()
                page.set_default_timeout(WAIT_MS)
                page.goto(server.url + "/")
                for preset, messages in CHATS:
                    chat(page, preset, messages)
                shown = page.url
                page.wait_for_timeout(500)
                save(page, args.out / "chat-light.png")

                for name, options in (("chat-dark.png", {"viewport": DESKTOP,
                                                         "color_scheme": "dark"}),
                                      ("chat-phone.png", {"viewport": PHONE,
                                                          "color_scheme": "light",
                                                          "is_mobile": True,
                                                          "has_touch": True})):
                    other = browser.new_context(**options)
                    other.add_cookies(context.cookies())
                    view = other.new_page()
                    view.set_default_timeout(WAIT_MS)
                    view.goto(shown)
                    steps.wait_connected(view)
                    view.wait_for_timeout(500)
                    save(view, args.out / name)
                    other.close()

                page.goto(server.url + "/admin/cache/")
                page.wait_for_load_state("networkidle")
                save(page, args.out / "dashboard.png")
                browser.close()
            if args.check_api:
                check_api(server)
        finally:
            stop_live_server(proc)


if __name__ == "__main__":
    main()
