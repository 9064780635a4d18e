"""Helpers for talking to the real ASGI application with WebsocketCommunicator."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from chatapp.asgi import application

# One reply on two loaded CPU cores can take a while; this only bounds a hung test.
RECEIVE_TIMEOUT = 120


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def connect(conversation_id, user=None, origin: bytes = b"http://testserver"):
    """Open /ws/chat/<id>/ as `user` (None: anonymous). Returns (communicator, connected)."""
    headers = [(b"host", b"testserver"), (b"origin", origin)]
    if user is not None:
        cookie = await database_sync_to_async(_session_cookie)(user)
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    comm = WebsocketCommunicator(application, f"/ws/chat/{conversation_id}/", headers=headers)
    connected, _ = await comm.connect(timeout=RECEIVE_TIMEOUT)
    return comm, connected


async def receive(comm) -> dict:
    return await comm.receive_json_from(timeout=RECEIVE_TIMEOUT)


async def receive_until(comm, predicate) -> list[dict]:
    """Every event up to and including the first one for which predicate(event) holds."""
    events = []
    while True:
        event = await receive(comm)
        events.append(event)
        if predicate(event):
            return events


def is_done(event: dict, reply_id: int | None = None) -> bool:
    return event["type"] == "message.done" and (
        reply_id is None or event["message_id"] == reply_id
    )


def created_reply_id(events: list[dict]) -> int:
    return [
        e["message"]["id"] for e in events
        if e["type"] == "message.created" and e["message"]["role"] == "assistant"
    ][-1]


async def close_code(comm) -> int:
    """The close code of a socket the server closes right after accepting it."""
    out = await comm.receive_output(timeout=RECEIVE_TIMEOUT)
    assert out["type"] == "websocket.close", out
    # Let the consumer see the disconnect and exit now, rather than be cancelled (with
    # its channel-layer receive) when the test's event loop is torn down.
    await comm.disconnect()
    return out.get("code")
