"""Against a live daphne server (a separate process, as in production):
the dashboard in a real browser, and /readyz with an unreachable database."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest

from ..e2e import chat_steps as steps
from ..e2e.conftest import (
    ARTIFACTS,
    PYTHON,
    ROOT,
    _free_port,
    spawn_daphne,
    start_live_server,
    stop_live_server,
)

WAIT_MS = 180_000  # bounds a hung test; two busy cores can be slow
ADMIN, PASSWORD = "operator", "operator-pass-123"


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_readyz_is_unready_while_the_database_is_unreachable(tmp_path):
    """PostgreSQL on a port where nothing listens: alive, but not ready (503)."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = _free_port()
    closed = _free_port()  # bound and released: nothing listens there
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatapp.settings",
           "DATABASE_URL": f"postgres://postgres@127.0.0.1:{closed}/prefixchat",
           "DJANGO_SECRET_KEY": "live-server-test-key", "LLM_PRELOAD": "0",
           "DASHBOARD_SAMPLE_INTERVAL_S": "0"}
    env.pop("REDIS_URL", None)
    log = ARTIFACTS / "readyz-server.log"
    proc, url = spawn_daphne(env, port, log)
    try:
        for _ in range(300):  # bounded wait for the server to answer
            assert proc.poll() is None, log.read_text()[-3000:]
            with contextlib.suppress(OSError):
                if _get(url + "/healthz")[0] == 200:
                    break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
        status, body = _get(url + "/readyz")
        report = json.loads(body)
        assert status == 503 and report["status"] == "unready"
        assert report["checks"]["database"]["ok"] is False
        assert "OperationalError" in report["checks"]["database"]["detail"]
        assert _get(url + "/healthz") == (200, b'{"status": "ok"}')
    finally:
        stop_live_server(proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live, proc = start_live_server(
        tmp_path_factory.mktemp("dashboard"), "dashboard",
        CHAT_MAX_NEW_TOKENS="8", DASHBOARD_SAMPLE_INTERVAL_S="1",
        LLM_PRELOAD="1",  # the page is opened before any chat: the engine must load itself
    )
    subprocess.run([PYTHON, "manage.py", "ensure_admin"], cwd=ROOT, check=True,
                   capture_output=True,
                   env={**live.env, "PREFIXCHAT_ADMIN_USER": ADMIN,
                        "PREFIXCHAT_ADMIN_PASSWORD": PASSWORD})
    yield live
    stop_live_server(proc)



def queries(page) -> int:
    return int(page.get_attribute("#total-queries", "data-value"))


@pytest.mark.model
def test_dashboard_charts_render_and_figures_follow_a_new_message(server, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(server.url + "/admin/login/?next=/admin/cache/")
    page.fill("#id_username", ADMIN)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#dashboard")

    # The model loads in the background; the live refresh brings its engine in, then the
    # sampler's history: the block chart gets points without reloading the page.
    page.evaluate("window.__notReloaded = true")
    page.wait_for_selector(".engine[data-engine]")
    page.wait_for_selector("svg#chart-blocks circle.point")
    for chart in ("chart-hit-rate", "chart-blocks", "chart-ttft"):
        assert page.locator(f"svg#{chart}").is_visible()
    before = queries(page)

    chat = context.new_page()
    chat.set_default_timeout(WAIT_MS)
    chat.goto(server.url + "/")
    steps.new_chat(chat)
    steps.chat(chat, ["Say hi."])
    chat.close()

    page.wait_for_function(
        "(n) => Number(document.querySelector('#total-queries').dataset.value) > n", arg=before)
    page.wait_for_selector("#recent td:text-matches('^msg-\\\\d+$')")
    page.wait_for_selector("svg#chart-hit-rate circle.point")
    assert page.evaluate("window.__notReloaded") is True
    assert queries(page) > before
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    context.close()
