"""The KV tier through the real chat path on live daphne servers: a conversation's KV
survives a restart with LLM_KV_DIR (its next turn hits everything it had computed; a
corrupt file in the folder is skipped and logged; opening the conversation brings its
blocks back before its next message), and a small pool without a tier
says "evicted" when a conversation comes back after others pushed its blocks out."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from websockets.asyncio.client import connect

from tests.chatapp.e2e.conftest import start_live_server, stop_live_server

pytestmark = pytest.mark.model

WAIT_S = 300  # bounds a hung test only
BLOCK = 16


def tier_restores(server) -> float:
    """Blocks the server's engine has copied back from its host/disk tier (/metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "prefixchat:kv_tier_restores_total")


async def _turns(server, client: dict, contents: list[str], before_sending=None) -> list[dict]:
    """Each message in turn over one socket; the final reply of each. `before_sending`
    runs (in a thread) once the socket is open, before the first message."""
    url = f"{server.ws_url}/ws/chat/{client['conversation_id']}/"
    headers = {"Cookie": f"sessionid={client['sessionid']}"}
    finals = []
    async with connect(url, additional_headers=headers, origin=server.url) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))["type"] == "hello"
        if before_sending is not None:
            await asyncio.to_thread(before_sending)
        for content in contents:
            await ws.send(json.dumps({"type": "send", "content": content}))
            reply_id = None
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
                if event["type"] == "message.created" and event["message"]["role"] == "assistant":
                    reply_id = event["message"]["id"]
                if event["type"] == "message.done" and event["message_id"] == reply_id:
                    assert event["message"]["status"] == "done", event
                    finals.append(event["message"])
                    break
    return finals


def turns(server, client, contents, before_sending=None):
    return asyncio.run(_turns(server, client, contents, before_sending))


def held(final: dict) -> int:
    """What a finished turn leaves cached: its prompt and reply, to whole blocks (the
    reply's last token is never fed back)."""
    usage = final["usage"]
    return (usage["prompt_tokens"] + usage["completion_tokens"] - 1) // BLOCK * BLOCK


QUESTIONS = ["Name a colour.", "Name a planet.", "Name a river.", "Name a mountain."]


def test_a_conversation_s_kv_survives_a_restart(tmp_path):
    kv_dir = tmp_path / "kv"
    settings = {"LLM_KV_DIR": str(kv_dir), "CHAT_MAX_NEW_TOKENS": "24", "LLM_PRELOAD": "1"}
    server, proc = start_live_server(tmp_path, "kv-restart", **settings)
    try:
        [client] = server.seed("users", "1", "kv")
        finals = turns(server, client, QUESTIONS[:3])
    finally:
        stop_live_server(proc)  # a clean stop: the engine keeps its pool in kv_dir
    files = sorted(kv_dir.glob("*.kv"))
    assert files, "nothing was kept on disk"
    # A corrupt file among them (a real block's name, garbage inside) is skipped, logged.
    corrupt = kv_dir / ("ab" * 32 + ".kv")
    corrupt.write_bytes(b"\x00garbage" * 100)

    server, proc = start_live_server(tmp_path, "kv-restart-2", **settings)

    def prewarmed() -> None:
        # Opening the conversation brings its blocks back before any message is sent.
        deadline = time.monotonic() + 60
        while tier_restores(server) == 0:
            assert time.monotonic() < deadline, "opening the conversation restored nothing"
            time.sleep(0.2)

    try:
        [fourth] = turns(server, client, QUESTIONS[3:], before_sending=prewarmed)
    finally:
        stop_live_server(proc)
    usage = fourth["usage"]
    assert usage["cached_tokens"] >= held(finals[-1]), (finals[-1]["usage"], usage)
    assert usage["prefix_cache"]["reason"] == "full", usage
    log = server.log.read_text()
    assert f"skipping {corrupt}" in log, log[-3000:]


def test_a_small_pool_says_evicted_when_a_conversation_comes_back(tmp_path):
    # 24 blocks: one conversation's turn fits; four others push it out.
    server, proc = start_live_server(tmp_path, "kv-evicted", LLM_NUM_BLOCKS="24",
                                     CHAT_MAX_NEW_TOKENS="16", LLM_PRELOAD="1")
    try:
        first, *others = server.seed("users", "5", "ev")
        turns(server, first, QUESTIONS[:1])
        for client in others:
            turns(server, client, QUESTIONS[1:2])
        [back] = turns(server, first, QUESTIONS[2:3])
    finally:
        stop_live_server(proc)
    receipt = back["usage"]["prefix_cache"]
    assert receipt["reason"] == "evicted" and receipt["evicted_from"] == "pool", receipt
