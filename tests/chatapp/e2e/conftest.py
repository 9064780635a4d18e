"""A live daphne server on a free port, with its own file-based SQLite database.

The server is a separate process (as in production): tests reach it only over
HTTP and WebSockets, and seed users through tests/chatapp/e2e/seed.py run against
the same database file.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "artifacts"
PYTHON = sys.executable
DAPHNE = str(Path(sys.executable).with_name("daphne"))


@dataclass
class LiveServer:
    url: str
    host: str
    env: dict
    log: Path

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://")

    def seed(self, *args: str):
        out = subprocess.run(
            [PYTHON, str(ROOT / "tests/chatapp/e2e/seed.py"), *args],
            env=self.env, cwd=ROOT, capture_output=True, text=True, check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_serving(url: str, proc: subprocess.Popen, log: Path) -> None:
    # Bounded: daphne answers within a few seconds of starting, or something is wrong.
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/accounts/login/", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    raise RuntimeError(f"daphne did not start serving:\n{log.read_text()[-3000:]}")


def spawn_daphne(env: dict, port: int, log: Path) -> tuple[subprocess.Popen, str]:
    """daphne serving the project on 127.0.0.1:port, its output in `log`."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [DAPHNE, "-b", "127.0.0.1", "-p", str(port), "chatapp.asgi:application"],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )
    return proc, f"http://127.0.0.1:{port}"


def start_live_server(tmp_path: Path, name: str, **settings: str):
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / f"{name}-server.log"
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatapp.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'live.sqlite3'}",
        "DJANGO_SECRET_KEY": "live-server-test-key",
        "CHAT_TEMPERATURE": "0",
        # Model-written titles would rename the conversations tests look for.
        "CHAT_TITLES": "0",
        **settings,
    }
    env.pop("DJANGO_DEBUG", None)
    subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"],
                   env=env, cwd=ROOT, check=True)
    proc, url = spawn_daphne(env, port, log)
    try:
        _wait_until_serving(url, proc, log)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return LiveServer(url=url, host=f"127.0.0.1:{port}", env=env, log=log), proc


def stop_live_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory):
    """One live server for the browser and load tests (the model loads once)."""
    live, proc = start_live_server(
        tmp_path_factory.mktemp("live"), "live",
        # Room for the reply the browser test stops; the other prompts ask for short answers.
        CHAT_MAX_NEW_TOKENS="512",
        # Long enough to overflow the model's context: the way to make generation fail.
        MAX_USER_MESSAGE_CHARS="60000",
    )
    yield live
    stop_live_server(proc)
