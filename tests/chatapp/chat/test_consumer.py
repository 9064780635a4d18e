"""The chat WebSocket against the real embedded engine (SmolLM2) and the real database."""

import asyncio

import pytest
from channels.db import database_sync_to_async
from django.test import Client
from django.urls import reverse

from chatapp.chat import services
from chatapp.chat.models import Message
from chatapp.generation import replies
from chatapp.generation.embedded import get_engine

from .wsclient import RECEIVE_TIMEOUT, connect, created_reply_id, is_done, receive, receive_until

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

LONG_PROMPT = "Count from 1 to 300, one number per line, and say nothing else."


@database_sync_to_async
def new_conversation(user):
    return services.conversation_create(owner=user)


@database_sync_to_async
def get_message(pk):
    return Message.objects.get(pk=pk)


@database_sync_to_async
def all_messages(conv):
    return list(Message.objects.filter(conversation=conv).order_by("id").values())


async def send_and_wait(comm, content, **extra):
    await comm.send_json_to({"type": "send", "content": content, **extra})
    events = await receive_until(comm, is_done)
    return created_reply_id(events), events


def assert_stream_is_whole(events, reply_id):
    deltas = [e for e in events if e["type"] == "message.delta" and e["message_id"] == reply_id]
    done = next(e for e in events if is_done(e, reply_id))
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
    assert done["seq"] == len(deltas) + 1
    assert "".join(d["text"] for d in deltas) == done["message"]["content"]
    return deltas, done


async def test_a_message_streams_a_reply_persisted_with_ids_and_usage(alice):
    conv = await new_conversation(alice)
    comm, connected = await connect(conv.pk, alice)
    assert connected
    hello = await receive(comm)
    assert hello["type"] == "hello" and hello["conversation"]["id"] == conv.pk

    reply_id, events = await send_and_wait(comm, "Say hello in three words.")
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["message.created", "message.created", "conversation.updated",
                         "message.started"]
    deltas, done = assert_stream_is_whole(events, reply_id)
    assert len(deltas) >= 2  # streamed in batches, not in one piece

    reply = await get_message(reply_id)
    assert reply.status == "done" and reply.finish_reason in ("stop", "length")
    assert reply.content == done["message"]["content"] and reply.content
    assert reply.generated_token_ids and reply.completion_tokens == len(reply.generated_token_ids)
    # The stored segment holds the generated ids verbatim (token-level history).
    gen = [t for t in reply.generated_token_ids if t not in (2,)]
    assert any(reply.token_ids[i:i + len(gen)] == gen for i in range(len(reply.token_ids)))
    assert reply.prompt_tokens > 0 and reply.cached_tokens is not None and reply.ttft > 0
    usage = done["message"]["usage"]
    assert usage["prompt_tokens"] == reply.prompt_tokens
    assert usage["cached_tokens"] == reply.cached_tokens
    assert usage["completion_tokens"] == reply.completion_tokens
    user_msg = await get_message(reply.parent_id)
    assert user_msg.token_ids  # the user segment is stored once, for every later turn
    await comm.disconnect()


async def test_turn_two_reuses_the_whole_blocks_of_turn_one(alice):
    conv = await new_conversation(alice)
    comm, _ = await connect(conv.pk, alice)
    await receive(comm)
    first_id, _ = await send_and_wait(comm, "Name a colour.")
    second_id, events = await send_and_wait(comm, "Name another one.")
    first, second = await get_message(first_id), await get_message(second_id)
    block = 16
    assert second.prompt_tokens > first.prompt_tokens
    assert second.cached_tokens >= (first.prompt_tokens // block) * block
    done = next(e for e in events if is_done(e, second_id))
    assert done["message"]["usage"]["cached_tokens"] == second.cached_tokens
    await comm.disconnect()


async def start_long_reply(user, settings, prompt: str = LONG_PROMPT):
    """A new conversation whose first reply (up to 400 tokens) has begun streaming."""
    settings.CHAT_MAX_NEW_TOKENS = 400
    conv = await new_conversation(user)
    comm, _ = await connect(conv.pk, user)
    await receive(comm)
    await comm.send_json_to({"type": "send", "content": prompt})
    events = await receive_until(comm, lambda e: e["type"] == "message.delta")
    return comm, events, created_reply_id(events)


async def test_stop_mid_stream_frees_the_blocks_and_keeps_a_stopped_reply(alice, settings):
    comm, events, reply_id = await start_long_reply(alice, settings)
    await comm.send_json_to({"type": "stop", "message_id": reply_id})
    events += await receive_until(comm, is_done)
    _, done = assert_stream_is_whole(events, reply_id)

    reply = await get_message(reply_id)
    assert reply.status == "stopped" and reply.finish_reason == "abort"
    assert 0 < reply.completion_tokens < 400
    assert reply.content == done["message"]["content"]
    metrics = get_engine().metrics()
    assert metrics["num_running"] == 0 and metrics["blocks_used"] == 0

    # A stopped reply is a valid history: the conversation goes on from it.
    settings.CHAT_MAX_NEW_TOKENS = 8
    next_id, _ = await send_and_wait(comm, "Thanks.")
    nxt = await get_message(next_id)
    assert nxt.status == "done" and nxt.cached_tokens >= (reply.prompt_tokens // 16) * 16
    await comm.disconnect()


async def test_a_closed_socket_does_not_stop_the_reply_and_a_new_one_resumes_it(alice,
                                                                                settings):
    """Only Stop stops a reply: one whose page went away goes on and is stored whole, and
    a page that opens meanwhile gets its text so far, then the stream from the next seq."""
    # A story of hundreds of tokens: still streaming when the page comes back.
    comm, events, reply_id = await start_long_reply(
        alice, settings, prompt="Write a long story about a dragon who learns to cook.")
    await comm.disconnect()
    reply = await get_message(reply_id)
    again, _ = await connect(reply.conversation_id, alice)
    assert (await receive(again))["type"] == "hello"
    events = await receive_until(again, lambda e: is_done(e, reply_id))
    resumed = events[0]
    assert resumed["type"] == "message.resumed" and resumed["message_id"] == reply_id
    deltas = [e for e in events if e["type"] == "message.delta"]
    # Deltas given out before the snapshot may still be queued for this socket: they are
    # the ones the snapshot holds already (the page skips them).
    after = [d for d in deltas if d["seq"] > resumed["seq"]]
    assert [d["seq"] for d in after] == list(range(resumed["seq"] + 1, len(after) + resumed["seq"] + 1))
    done = events[-1]
    assert done["seq"] == resumed["seq"] + len(after) + 1
    assert resumed["text"] + "".join(d["text"] for d in after) == done["message"]["content"]
    stored = await get_message(reply_id)
    assert stored.status == "done" and stored.finish_reason in ("stop", "length")
    assert stored.content == done["message"]["content"] and stored.completion_tokens > 0
    await again.disconnect()
    metrics = get_engine().metrics()
    assert metrics["num_running"] == 0 and metrics["blocks_used"] == 0


async def test_regenerate_and_edit_make_siblings_and_leave_the_originals(alice):
    conv = await new_conversation(alice)
    comm, _ = await connect(conv.pk, alice)
    await receive(comm)
    first_id, _ = await send_and_wait(comm, "Name a fruit.")
    before = await all_messages(conv)

    await comm.send_json_to({"type": "regenerate", "message_id": first_id})
    events = await receive_until(comm, is_done)
    regen_id = created_reply_id(events)
    assert_stream_is_whole(events, regen_id)

    first = await get_message(first_id)
    await comm.send_json_to({"type": "edit", "message_id": first.parent_id,
                             "content": "Name a vegetable."})
    events = await receive_until(comm, is_done)
    edit_reply_id = created_reply_id(events)

    regen, edit_reply = await get_message(regen_id), await get_message(edit_reply_id)
    edited_user = await get_message(edit_reply.parent_id)
    assert regen.parent_id == first.parent_id and regen.status == "done"
    assert edited_user.parent_id is None and edited_user.content == "Name a vegetable."
    assert edited_user.pk != first.parent_id and edit_reply.status == "done"
    after = {m["id"]: m for m in await all_messages(conv)}
    for old in before:
        assert after[old["id"]] == old
    await comm.disconnect()


async def test_every_tab_on_the_conversation_sees_the_stream(alice):
    conv = await new_conversation(alice)
    tab1, _ = await connect(conv.pk, alice)
    tab2, _ = await connect(conv.pk, alice)
    await receive(tab1)
    await receive(tab2)
    reply_id, events1 = await send_and_wait(tab1, "Say hi.")
    events2 = await receive_until(tab2, is_done)
    _, done1 = assert_stream_is_whole(events1, reply_id)
    _, done2 = assert_stream_is_whole(events2, reply_id)
    assert done1 == done2
    await tab1.disconnect()
    await tab2.disconnect()


async def test_a_message_over_the_context_is_refused_unstored_and_the_chat_goes_on(
    alice, monkeypatch
):
    # The engine's own limit decides (not the setting, which the KV pool may undercut).
    engine = await asyncio.to_thread(get_engine)
    monkeypatch.setattr(engine, "max_model_len", 96)
    monkeypatch.setattr(engine.engine, "max_model_len", 96)
    conv = await new_conversation(alice)
    comm, _ = await connect(conv.pk, alice)
    await receive(comm)
    await comm.send_json_to({"type": "send", "content": "word " * 200})
    error = await receive(comm)
    assert error["type"] == "error" and error["code"] == "context_length_exceeded"
    assert "context holds 96" in error["message"]
    assert await all_messages(conv) == []  # nothing stored, no failed reply

    next_id, _ = await send_and_wait(comm, "Hi.")
    nxt = await get_message(next_id)
    assert nxt.status == "done"
    await comm.disconnect()


async def test_deleting_a_conversation_mid_reply_stops_the_engine_request(alice, settings):
    settings.CHAT_MAX_NEW_TOKENS = 400
    conv = await new_conversation(alice)
    comm, _ = await connect(conv.pk, alice)
    await receive(comm)
    await comm.send_json_to({"type": "send", "content": LONG_PROMPT})
    reply_id = created_reply_id(await receive_until(comm, lambda e: e["type"] == "message.delta"))

    def delete():
        client = Client()
        client.force_login(alice)
        return client.post(reverse("chat:delete", args=[conv.pk])).status_code

    assert await database_sync_to_async(delete)() == 302
    await comm.send_json_to({"type": "send", "content": "Still there?"})
    out = await comm.receive_output(timeout=RECEIVE_TIMEOUT)
    while out["type"] != "websocket.close":  # stream events still in flight
        out = await comm.receive_output(timeout=RECEIVE_TIMEOUT)
    assert out["code"] == 4404
    await comm.disconnect(timeout=RECEIVE_TIMEOUT)
    await asyncio.wait_for(replies.ended(reply_id), RECEIVE_TIMEOUT)
    metrics = get_engine().metrics()
    assert metrics["num_running"] == 0 and metrics["blocks_used"] == 0
    assert not await database_sync_to_async(Message.objects.filter(conversation_id=conv.pk).exists)()
