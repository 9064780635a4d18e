"""Thirty WebSocket clients at once against the live server, each its own user and
conversation: every reply completes, nobody sees another conversation's events, and
everything is stored."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from websockets.asyncio.client import connect

pytestmark = pytest.mark.model

CLIENTS = 30
RECEIVE_TIMEOUT = 300  # bounds a hung test only


@pytest.fixture(scope="module")
def server(chat_server):
    return chat_server


async def one_client(server, client: dict, index: int) -> dict:
    url = f"{server.ws_url}/ws/chat/{client['conversation_id']}/"
    headers = {"Cookie": f"sessionid={client['sessionid']}"}
    async with connect(url, additional_headers=headers, origin=server.url) as ws:
        hello = json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_TIMEOUT))
        assert hello["type"] == "hello"
        assert hello["conversation"]["id"] == client["conversation_id"]
        await ws.send(json.dumps({"type": "send", "content": f"Say the number {index}."}))
        events, own_ids, reply_id = [], set(), None
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_TIMEOUT))
            events.append(event)
            if event["type"] == "message.created":
                assert event["message"]["conversation_id"] == client["conversation_id"]
                own_ids.add(event["message"]["id"])
                if event["message"]["role"] == "assistant":
                    reply_id = event["message"]["id"]
            elif event["type"] == "conversation.updated":
                assert event["conversation"]["id"] == client["conversation_id"]
            elif "message_id" in event:
                assert event["message_id"] in own_ids, (client, event)
            if event["type"] == "message.done" and event["message_id"] == reply_id:
                break
    deltas = [e for e in events if e["type"] == "message.delta"]
    done = events[-1]
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
    assert "".join(d["text"] for d in deltas) == done["message"]["content"]
    return done["message"]


async def all_clients(server, clients):
    return await asyncio.gather(*(one_client(server, c, i) for i, c in enumerate(clients)))


def stored(server, client) -> list[dict]:
    req = urllib.request.Request(
        f"{server.url}/c/{client['conversation_id']}/messages.json",
        headers={"Cookie": f"sessionid={client['sessionid']}"},
    )
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read())["messages"]


def test_thirty_concurrent_clients_each_get_their_own_reply(server):
    clients = server.seed("users", str(CLIENTS), "load")
    finals = asyncio.run(all_clients(server, clients))

    assert len(finals) == CLIENTS
    for client, final in zip(clients, finals, strict=True):
        assert final["status"] == "done", final
        assert final["conversation_id"] == client["conversation_id"]
        assert final["usage"]["completion_tokens"] > 0
        messages = stored(server, client)
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[1] == final
