"""kill -9 of the web process mid-reply, then a restart: the reply is finished as
interrupted with the text persisted before the kill, Continue resumes it, and the next
message continues its branch. (A worker killed mid-reply: tests/chatapp/generation/
test_workers.py, which needs PostgreSQL and Redis.)"""

from __future__ import annotations

import asyncio
import json
import time

import httpx2 as httpx
import pytest
from websockets.asyncio.client import connect

from tests.chatapp.e2e.conftest import (
    _wait_until_serving,
    spawn_daphne,
    start_live_server,
    stop_live_server,
)

pytestmark = pytest.mark.model

HEARTBEAT_S = 0.5
READY_LIMIT_S = 10  # the bound: not streaming within this long after ready
LONG = "Write a long story about a lighthouse keeper and a storm."


def wait_ready(url: str, limit_s: float = 300) -> float:
    """Until /readyz says the model is loaded; the time it did."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return time.monotonic()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server never became ready")


class Socket:
    def __init__(self, ws):
        self.ws = ws

    async def send(self, frame: dict) -> None:
        await self.ws.send(json.dumps(frame))

    async def until(self, kind: str, message_id: int | None = None, limit_s: float = 120):
        while True:
            event = json.loads(await asyncio.wait_for(self.ws.recv(), limit_s))
            if event["type"] == "error":
                raise AssertionError(event)
            if event["type"] == kind and message_id in (None, event.get("message_id")):
                return event


def open_socket(live, user: dict):
    url = f"{live.ws_url}/ws/chat/{user['conversation_id']}/"
    return connect(url, open_timeout=30, additional_headers={
        "Cookie": f"sessionid={user['sessionid']}", "Origin": live.url})


async def stream_then_kill(live, user: dict, proc) -> tuple[int, str, str]:
    """Send LONG, read 12 deltas, go on reading past a heartbeat, then kill -9 the server.
    Returns (reply id, the text streamed a heartbeat and more before the kill, all of it)."""
    async with open_socket(live, user) as ws:
        sock = Socket(ws)
        await sock.until("hello")
        await sock.send({"type": "send", "content": LONG})
        created = await sock.until("message.created")
        while created["message"]["role"] != "assistant":
            created = await sock.until("message.created")
        reply_id = created["message"]["id"]
        text, deltas = "", 0
        while deltas < 12:
            text += (await sock.until("message.delta", reply_id))["text"]
            deltas += 1
        # Everything streamed by now has been persisted once more than HEARTBEAT_S later.
        safe, settle = text, time.monotonic() + 3 * HEARTBEAT_S
        while time.monotonic() < settle:
            text += (await sock.until("message.delta", reply_id))["text"]
        proc.kill()
        proc.wait()
    return reply_id, safe, text


def tree(live, user: dict) -> dict:
    response = httpx.get(f"{live.url}/c/{user['conversation_id']}/messages.json",
                         cookies={"sessionid": user["sessionid"]}, timeout=30)
    response.raise_for_status()
    return {m["id"]: m for m in response.json()["messages"]}


def test_kill_9_of_the_web_process_mid_reply_then_restart(tmp_path):
    live, proc = start_live_server(
        tmp_path, "crash", LLM_PRELOAD="1", CHAT_MAX_NEW_TOKENS="400",
        CHAT_HEARTBEAT_S=str(HEARTBEAT_S), CHAT_ORPHAN_SWEEP_S="1",
        # Long enough that only the dead-process rule can explain a recovery in time.
        CHAT_ORPHAN_S="60",
    )
    try:
        user = live.seed("users", "1", "crash")[0]
        wait_ready(live.url)
        reply_id, safe, streamed = asyncio.run(stream_then_kill(live, user, proc))

        port = int(live.url.rsplit(":", 1)[1])
        proc, _ = spawn_daphne(live.env, port, live.log.with_suffix(".restart.log"))
        _wait_until_serving(live.url, proc, live.log.with_suffix(".restart.log"))
        ready = wait_ready(live.url)
        while (reply := tree(live, user)[reply_id])["status"] in ("pending", "streaming"):
            assert time.monotonic() - ready < READY_LIMIT_S, "the reply is still streaming"
            time.sleep(0.2)
        assert reply["status"] == "interrupted" and reply["finish_reason"] == "interrupted"
        # At least what was streamed a heartbeat before the kill; nothing it never said.
        assert reply["content"].startswith(safe) and streamed.startswith(reply["content"])
        assert reply["usage"]["completion_tokens"] > 0 and reply["can_continue"]

        async def continue_then_next_turn() -> tuple[dict, dict, dict]:
            async with open_socket(live, user) as ws:
                sock = Socket(ws)
                await sock.until("hello")
                await sock.send({"type": "continue", "message_id": reply_id})
                started = await sock.until("message.started", reply_id)
                assert started["text"] == reply["content"]
                continued = (await sock.until("message.done", reply_id))["message"]
                await sock.send({"type": "send", "content": "Thank you."})
                created = await sock.until("message.created")
                done = (await sock.until("message.done"))["message"]
                return continued, created["message"], done

        continued, next_user, next_reply = asyncio.run(continue_then_next_turn())
        assert continued["status"] == "done" and continued["content"].startswith(reply["content"])
        assert len(continued["content"]) > len(reply["content"])
        assert next_user["parent_id"] == reply_id and next_reply["status"] == "done"
    finally:
        stop_live_server(proc)
