"""One live daphne server (real engine, real SmolLM2) for this folder, and helpers to make
users and API keys in its database (through manage.py create_api_key, as an operator would).
"""

from __future__ import annotations

import itertools
import subprocess

import pytest

from tests.chatapp.e2e.conftest import PYTHON, ROOT, LiveServer, start_live_server, stop_live_server

_names = itertools.count()


@pytest.fixture(scope="session")
def api_server(tmp_path_factory) -> LiveServer:
    server, proc = start_live_server(
        tmp_path_factory.mktemp("api-live"),
        "api",
        CHAT_MAX_NEW_TOKENS="8",
        API_RATE_LIMIT_RPM="100000",
        API_MAX_CONCURRENT="8",
        API_DEFAULT_MAX_TOKENS="16",
        LLM_PRELOAD="1",
    )
    yield server
    stop_live_server(proc)


class Accounts:
    def __init__(self, server: LiveServer):
        self.server = server

    def user(self, prefix: str = "apiuser") -> dict:
        """A new user with a browser session and one empty conversation."""
        return self.server.seed("users", "1", f"{prefix}{next(_names)}x")[0]

    def key(self, username: str, *extra: str) -> str:
        out = subprocess.run(
            [PYTHON, "manage.py", "create_api_key", "--user", username, *extra],
            env=self.server.env, cwd=ROOT, capture_output=True, text=True, check=True,
        )
        return out.stdout.strip().splitlines()[-1]

    def user_with_key(self, *extra: str) -> tuple[dict, str]:
        user = self.user()
        return user, self.key(user["username"], *extra)


@pytest.fixture(scope="session")
def accounts(api_server) -> Accounts:
    return Accounts(api_server)
