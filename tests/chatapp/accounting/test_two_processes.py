"""Two daphne processes on one database and one Redis: a key's limits and a user's token
budget hold across both, the chat page says why it refused, and usage rows add up."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid

import httpx2 as httpx
import pytest
import redis
from websockets.asyncio.client import connect

from tests.chatapp.accounting.conftest import TEST_REDIS
from tests.chatapp.api.conftest import MODEL, Accounts
from tests.chatapp.e2e.conftest import (
    ARTIFACTS,
    PYTHON,
    ROOT,
    _free_port,
    _wait_until_serving,
    spawn_daphne,
    start_live_server,
    stop_live_server,
)

LONG = {"model": MODEL, "max_tokens": 400, "temperature": 0, "stream": True,
        "messages": [{"role": "user", "content": "Count from 1 to 200, separated by commas."}]}
SHORT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    try:
        redis.Redis.from_url(TEST_REDIS).ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    prefix = f"test-limits-{uuid.uuid4().hex}"
    first, first_proc = start_live_server(
        tmp_path_factory.mktemp("limits"), "limits-a",
        LIMITS_REDIS_URL=TEST_REDIS, LIMITS_REDIS_PREFIX=prefix,
        REDIS_URL="", CELERY_BROKER_URL="", LLM_PRELOAD="0", API_DEFAULT_MAX_TOKENS="16",
    )
    log = ARTIFACTS / "limits-b-server.log"
    second_proc, url = spawn_daphne(first.env, _free_port(), log)
    try:
        _wait_until_serving(url, second_proc, log)
        yield first, url
    finally:
        stop_live_server(second_proc)
        stop_live_server(first_proc)
        client = redis.Redis.from_url(TEST_REDIS)
        for name in client.scan_iter(f"{prefix}:*"):
            client.delete(name)


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def _shell(server, code: str) -> str:
    out = subprocess.run([PYTHON, "manage.py", "shell", "-c", code], env=server.env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def test_requests_per_minute_hold_across_processes(servers):
    first, second = servers
    [account] = Accounts(first).seed({"rpm": 10})
    statuses = []
    with httpx.Client(timeout=60) as client:
        for i in range(20):
            url = (first.url if i % 2 else second) + "/v1/models"
            response = client.get(url, headers=_auth(account["key"]))
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert int(response.headers["Retry-After"]) >= 1
                assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert statuses.count(200) == 10 and statuses.count(429) == 10


@pytest.mark.model
def test_one_slot_holds_across_processes(servers):
    first, second = servers
    [account] = Accounts(first).seed({"concurrent": 1})
    with httpx.Client(timeout=300) as client:
        with client.stream("POST", first.url + "/v1/chat/completions", json=LONG,
                           headers=_auth(account["key"])) as running:
            assert running.status_code == 200
            lines = running.iter_lines()
            assert next(lines).startswith("data: {")
            busy = client.post(second + "/v1/chat/completions", json=SHORT,
                               headers=_auth(account["key"]))
            assert busy.status_code == 429, busy.text
            assert busy.headers["Retry-After"] == "1"
            assert "at once" in busy.json()["error"]["message"]
        # The stream is closed: the first process releases the slot as the reply ends.
        for _ in range(120):
            again = client.post(second + "/v1/chat/completions", json=SHORT,
                                headers=_auth(account["key"]))
            if again.status_code != 429:
                break
            time.sleep(0.5)
        assert again.status_code == 200, again.text


async def _refused_on_the_chat_page(ws_url: str, account: dict, origin: str) -> dict:
    url = f"{ws_url}/ws/chat/{account['conversation_id']}/"
    headers = {"Cookie": f"sessionid={account['sessionid']}"}
    async with connect(url, additional_headers=headers, origin=origin) as ws:
        await ws.send(json.dumps({"type": "send", "content": "Hi"}))
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if event["type"] == "error":
                return event
            assert event["type"] != "message.created", event


@pytest.mark.model
def test_a_spent_token_budget_refuses_on_both_processes_and_usage_adds_up(servers):
    first, second = servers
    [account] = Accounts(first).seed({})
    _shell(first, "from chatapp.accounting.models import UserLimits; "
                  f"UserLimits.objects.create(user_id={account['user_id']}, tokens_per_day=5)")
    with httpx.Client(timeout=300) as client:
        done = client.post(first.url + "/v1/chat/completions", json=SHORT,
                           headers=_auth(account["key"]))
        assert done.status_code == 200, done.text
        usage = done.json()["usage"]
        for url in (first.url, second):
            refused = client.post(url + "/v1/chat/completions", json=SHORT,
                                  headers=_auth(account["key"]))
            assert refused.status_code == 429, refused.text
            assert "5 tokens per day for this user" in refused.json()["error"]["message"]
            assert int(refused.headers["Retry-After"]) >= 1
    event = asyncio.run(_refused_on_the_chat_page(
        second.replace("http://", "ws://"), account, second))
    assert event["code"] == "rate_limited" and "Token budget spent" in event["message"]
    row = json.loads(_shell(first, (
        "import json; from chatapp.accounting.models import DailyUsage as D; "
        f"r = D.objects.get(user_id={account['user_id']}); "
        "print(json.dumps([r.requests, r.prompt_tokens, r.cached_tokens, "
        "r.completion_tokens, r.errors, r.model]))")))
    assert row == [1, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
                   usage["completion_tokens"], 0, MODEL]
