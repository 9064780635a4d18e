"""One live daphne server (real engine, real SmolLM2) for this folder, and helpers to make
users and API keys in its database (through manage.py create_api_key, as an operator would).
"""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest
from rest_framework.test import APIClient

from tests.chatapp.e2e.conftest import PYTHON, ROOT, LiveServer, start_live_server, stop_live_server

_names = itertools.count()


def api_as(user) -> APIClient:
    """A DRF client signed in as `user`, for the API's views in this process."""
    client = APIClient()
    client.force_authenticate(user)
    return client


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
    """Users (with a session and an empty conversation) and their API keys, made in the
    server's database. Plain ones come from a pool seeded in one process."""

    POOL = 16

    def __init__(self, server: LiveServer):
        self.server = server
        self._pool: list[dict] = []

    def seed(self, *specs: dict) -> list[dict]:
        out = subprocess.run(
            [PYTHON, str(ROOT / "tests/chatapp/api/seed.py"), f"api{next(_names)}-",
             json.dumps(list(specs))],
            env=self.server.env, cwd=ROOT, capture_output=True, text=True, check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    def account(self, **spec) -> dict:
        """A user with a key: {username, user_id, sessionid, conversation_id, key}."""
        if spec:
            return self.seed(spec)[0]
        if not self._pool:
            self._pool = self.seed(*[{}] * self.POOL)
        return self._pool.pop()

    def user(self) -> dict:
        return self.account()

    def user_with_key(self, **spec) -> tuple[dict, str]:
        account = self.account(**spec)
        return account, account["key"]

    def command_key(self, username: str, *extra: str) -> str:
        """A key made the operator's way: manage.py create_api_key."""
        out = subprocess.run(
            [PYTHON, "manage.py", "create_api_key", "--user", username, *extra],
            env=self.server.env, cwd=ROOT, capture_output=True, text=True, check=True,
        )
        return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def accounts(api_server) -> Accounts:
    return Accounts(api_server)


MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def client_for(api_server):
    """An official `openai` client for a key (no retries: tests see every status as sent)."""
    import openai

    def make(key: str):
        return openai.OpenAI(api_key=key, base_url=api_server.url + "/v1", max_retries=0,
                             timeout=300)

    return make


@pytest.fixture(scope="module")
def openai_client(accounts, client_for):
    """An `openai` client on the key of a user of this module's own."""
    _, key = accounts.user_with_key()
    return client_for(key)


@pytest.fixture(scope="module")
def tokenizer():
    """The served model's tokenizer, as the tests count tokens."""
    from inference.loader import load_tokenizer

    return load_tokenizer()


# The context of short_context_server's model: a few turns outgrow it.
SHORT_CONTEXT = 512
QUESTIONS = (
    "Which colour do you get when you mix blue and yellow paint together on a palette?",
    "Name one animal that lives in the sea and one that lives in the desert, please.",
    "What is the capital of France, and which river runs through the middle of it?",
    "How many legs does a spider have, compared with an ordinary insect like an ant?",
)


def question(n: int) -> str:
    """Turn n's question, numbered, so no two turns of a long conversation are alike."""
    return f"{n + 1}. {QUESTIONS[n % len(QUESTIONS)]}"


@pytest.fixture(scope="module")
def short_context_server(request, tmp_path_factory) -> LiveServer:
    """A live server (its own, per module) whose model holds SHORT_CONTEXT tokens and
    whose replies, chat and API, default to 8 tokens."""
    name = "short-context-" + request.module.__name__.rsplit(".", 1)[-1]
    server, proc = start_live_server(
        tmp_path_factory.mktemp(name), name, LLM_MAX_MODEL_LEN=str(SHORT_CONTEXT),
        CHAT_MAX_NEW_TOKENS="8", API_DEFAULT_MAX_TOKENS="8", API_RATE_LIMIT_RPM="100000",
        LLM_PRELOAD="1")
    yield server
    stop_live_server(proc)
