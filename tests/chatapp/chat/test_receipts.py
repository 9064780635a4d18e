"""The cache receipt of a reply, through the real chat path (WebSocket, engine, database):
why its prompt's prefix-cache match ended where it did. One test per reason; "evicted"
and restores from the host/disk tier need a small pool: tests/chatapp/e2e/test_kv_tier.py."""

import uuid

import pytest
from channels.db import database_sync_to_async

from chatapp.chat import services
from chatapp.chat.models import Message

from .test_consumer import get_message, send_and_wait
from .wsclient import connect, receive

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


@database_sync_to_async
def fresh_conversation(user, name: str):
    # A system prompt nobody has used: the assistant's name is new.
    return services.conversation_create(owner=user, variables={"assistant_name": name})


async def open_chat(conv, user):
    comm, connected = await connect(conv.pk, user)
    assert connected
    assert (await receive(comm))["type"] == "hello"
    return comm


async def turn(comm, content, **extra) -> tuple[Message, dict]:
    reply_id, events = await send_and_wait(comm, content, **extra)
    done = next(e for e in events if e["type"] == "message.done")
    return await get_message(reply_id), done["message"]["usage"]["prefix_cache"]


async def test_cold_then_full(alice):
    conv = await fresh_conversation(alice, f"Cold{uuid.uuid4().hex[:8]}")
    comm = await open_chat(conv, alice)
    first, receipt = await turn(comm, "Name a colour.")
    assert receipt["reason"] == "cold" and receipt["matched_tokens"] == 0
    assert first.prefix_cache == receipt  # stored with the reply, shown as sent

    second, receipt = await turn(comm, "And another one?")
    # Everything the first turn left (prompt and reply, to whole blocks) hit.
    held = (first.prompt_tokens + first.completion_tokens - 1) // 16 * 16
    assert receipt["reason"] == "full" and receipt["matched_tokens"] >= held
    assert second.cached_tokens == receipt["matched_tokens"]
    await comm.disconnect()


DETAILS = (" Answer in one word, lower case, with no punctuation and no explanation, since"
           " the answer will be read aloud by a small speaker in a busy kitchen.")


async def test_an_edited_message_diverges_where_it_differs(alice):
    conv = await fresh_conversation(alice, f"Edit{uuid.uuid4().hex[:8]}")
    comm = await open_chat(conv, alice)
    # Long enough that whole blocks follow the edited word.
    first, _ = await turn(comm, "Name a colour." + DETAILS)
    await turn(comm, "And another one?")
    question = await get_message(first.parent_id)
    await comm.send_json_to({"type": "edit", "message_id": question.pk,
                             "content": "Name a planet." + DETAILS})
    from .wsclient import created_reply_id, is_done, receive_until

    events = await receive_until(comm, is_done)
    edited = await get_message(created_reply_id(events))
    receipt = edited.prefix_cache
    assert receipt["reason"] == "diverged", receipt
    new_question = await get_message(edited.parent_id)
    assert receipt["diverged_message_id"] == new_question.pk
    assert receipt["diverged_segment"] == "new message"
    # The system prompt was reused; the match ends in the block where the texts differ.
    assert receipt["matched_tokens"] == receipt["diverged_at"] // 16 * 16 > 0
    await comm.disconnect()


async def test_another_tenant_s_blocks_read_as_cold(alice, django_user_model):
    """Bob's receipt speaks only of his own history: the tokens Alice
    cached are "cold" for him, as if nobody had sent them."""
    name = f"Salt{uuid.uuid4().hex[:8]}"
    conv = await fresh_conversation(alice, name)
    comm = await open_chat(conv, alice)
    await turn(comm, "Name a colour.")
    await comm.disconnect()

    bob = await database_sync_to_async(django_user_model.objects.create_user)("bob")
    other = await fresh_conversation(bob, name)  # the same system prompt, another tenant
    comm = await open_chat(other, bob)
    reply, receipt = await turn(comm, "Name a colour.")
    assert receipt["reason"] == "cold" and receipt["matched_tokens"] == 0
    assert reply.cached_tokens == 0
    await comm.disconnect()


def test_a_receipt_stored_before_issue_26_shows_no_other_tenant():
    """Replies stored when the engine still said "salt" are shown as the tenant's "cold"
    by the one serializer of the page, the WebSocket and the conversations API."""
    from chatapp.chat.payloads import usage_dict

    stored = {"reason": "salt", "matched_tokens": 0, "tier_tokens": 0, "evicted_from": None}
    reply = Message(role=Message.Role.ASSISTANT, prompt_tokens=40, prefix_cache=stored)
    assert usage_dict(reply)["prefix_cache"]["reason"] == "cold"
    assert reply.prefix_cache["reason"] == "salt"  # the row itself is left as it was
