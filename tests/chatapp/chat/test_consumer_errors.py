"""Bad input on the chat WebSocket: clear error events, documented close codes, nothing lost.

None of these reach the engine, so they run without the model.
"""

import pytest
from channels.db import database_sync_to_async

from chatapp.chat import services
from chatapp.chat.models import Conversation, Message
from chatapp.generation import lifecycle
from chatapp.web.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED

from .wsclient import close_code, connect, receive

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def conversation_with_history(user):
    conv = services.conversation_create(owner=user, title="Alice's secrets")
    _, reply = services.message_send(conversation=conv, content="my secret question")
    lifecycle.reply_finish(reply=reply, status=Message.Status.DONE, content="secret answer",
                          generated_token_ids=[3, 2], segment_token_ids=[1, 3, 2, 4],
                          prompt_tokens=40, cached_tokens=0, ttft=0.1, finish_reason="stop")
    return conv


@database_sync_to_async
def snapshot(conv):
    return (
        list(Conversation.objects.filter(pk=conv.pk).values()),
        list(Message.objects.filter(conversation=conv).order_by("id").values()),
    )


async def open_socket(conv, user):
    comm, connected = await connect(conv.pk, user)
    assert connected
    assert (await receive(comm))["type"] == "hello"
    return comm


async def expect_error(comm, code):
    event = await receive(comm)
    assert event["type"] == "error" and event["code"] == code, event
    assert event["message"]
    return event


async def still_open(comm):
    await comm.send_json_to({"type": "ping"})
    assert (await receive(comm))["type"] == "pong"


async def test_malformed_frames_get_error_events_and_the_socket_survives(alice):
    conv = await conversation_with_history(alice)
    before = await snapshot(conv)
    comm = await open_socket(conv, alice)

    await comm.send_to(text_data="{not json")
    await expect_error(comm, "bad_json")
    await comm.send_to(text_data="[1, 2]")
    await expect_error(comm, "bad_request")
    await comm.send_to(bytes_data=b"\x00\x01")
    await expect_error(comm, "bad_request")
    await comm.send_json_to({"type": "dance"})
    event = await expect_error(comm, "unknown_event")
    assert event["request_type"] == "dance"
    await comm.send_json_to({"type": "regenerate"})
    await expect_error(comm, "invalid")
    await comm.send_json_to({"type": "edit", "message_id": "abc", "content": "x"})
    await expect_error(comm, "invalid")
    await comm.send_json_to({"type": "regenerate", "message_id": 999999})
    await expect_error(comm, "not_found")
    await comm.send_json_to({"type": "send", "content": "   "})
    await expect_error(comm, "empty_message")
    await still_open(comm)
    assert await snapshot(conv) == before
    await comm.disconnect()


async def test_a_message_over_the_limit_is_refused_and_nothing_is_stored(alice, settings):
    settings.MAX_USER_MESSAGE_CHARS = 100
    conv = await conversation_with_history(alice)
    before = await snapshot(conv)
    comm = await open_socket(conv, alice)
    await comm.send_json_to({"type": "send", "content": "x" * 101})
    event = await expect_error(comm, "message_too_long")
    assert "100" in event["message"]
    await still_open(comm)
    assert await snapshot(conv) == before
    await comm.disconnect()


async def test_unauthenticated_socket_is_closed_with_4401(alice):
    conv = await conversation_with_history(alice)
    comm, _ = await connect(conv.pk, user=None)
    assert await close_code(comm) == CLOSE_UNAUTHENTICATED


async def test_another_users_conversation_closes_like_a_missing_one(alice, bob):
    conv = await conversation_with_history(alice)
    before = await snapshot(conv)
    theirs, _ = await connect(conv.pk, bob)
    missing, _ = await connect(conv.pk + 1000, bob)
    junk, _ = await connect("not-a-number", bob)
    assert await close_code(theirs) == CLOSE_NOT_FOUND
    assert await close_code(missing) == CLOSE_NOT_FOUND
    assert await close_code(junk) == CLOSE_NOT_FOUND
    assert await snapshot(conv) == before


async def test_user_b_cannot_touch_messages_of_user_a_through_their_own_socket(alice, bob):
    conv_a = await conversation_with_history(alice)
    conv_b = await database_sync_to_async(services.conversation_create)(owner=bob)
    before = await snapshot(conv_a)
    reply_a = before[1][-1]["id"]
    user_a = before[1][0]["id"]
    comm = await open_socket(conv_b, bob)
    await comm.send_json_to({"type": "regenerate", "message_id": reply_a})
    await expect_error(comm, "not_found")
    await comm.send_json_to({"type": "edit", "message_id": user_a, "content": "mine now"})
    await expect_error(comm, "not_found")
    await comm.send_json_to({"type": "send", "content": "hi", "parent_id": reply_a})
    await expect_error(comm, "not_found")
    await comm.send_json_to({"type": "stop", "message_id": reply_a})
    await expect_error(comm, "not_found")
    await comm.send_json_to({"type": "select", "message_id": reply_a})
    await expect_error(comm, "not_found")
    await still_open(comm)
    assert await snapshot(conv_a) == before
    await comm.disconnect()


async def test_a_foreign_origin_is_refused_at_the_handshake(alice):
    conv = await conversation_with_history(alice)
    comm, connected = await connect(conv.pk, alice, origin=b"http://evil.example")
    assert not connected


async def test_text_a_tokenizer_cannot_take_gets_an_error_event(alice):
    conv = await database_sync_to_async(services.conversation_create)(owner=alice)
    before = await snapshot(conv)
    comm = await open_socket(conv, alice)
    for text in ('"a \\ud800 b"', '"a \\u0000 b"'):  # JSON: a lone surrogate, a NUL
        await comm.send_to(text_data=f'{{"type": "send", "content": {text}}}')
        event = await expect_error(comm, "invalid_value")
        assert event["request_type"] == "send"
    await comm.send_to(text_data='{"type": "send", "content": "a \\x41"}')  # bad escape
    await expect_error(comm, "bad_json")
    await still_open(comm)
    assert await snapshot(conv) == before  # nothing stored
    await comm.disconnect()


async def test_hostile_json_frames_get_bad_json_and_the_socket_survives(alice, settings):
    # The frames go through the bounded decoder HTTP bodies use (chatapp.api.json_body):
    # 100 000 levels deep was a RecursionError that closed the socket with 1011.
    conv = await conversation_with_history(alice)
    before = await snapshot(conv)
    comm = await open_socket(conv, alice)
    frames = {
        "[" * 100_000 + "]" * 100_000: "deeper than",
        '{"type":' * 20_000 + '"ping"' + "}" * 20_000: "deeper than",
        '{"type": "send", "content": NaN}': "NaN",
        '{"type": "ping", "type": "send", "content": "x"}': "appears twice",
        '{"type": "send", "content": 1e999}': "too large",
        "  ": "empty",
    }
    for frame, words in frames.items():
        await comm.send_to(text_data=frame)
        event = await expect_error(comm, "bad_json")
        assert words in event["message"], (frame[:40], event)
        await still_open(comm)
    # An unknown type is echoed briefly, in the message and in request_type.
    await comm.send_json_to({"type": "t" * 200_000})
    event = await expect_error(comm, "unknown_event")
    assert len(event["message"]) < 200 and len(event["request_type"]) <= 60
    settings.REQUEST_JSON_MAX_DEPTH = 2
    await comm.send_json_to({"type": "send", "content": "hi", "extra": [[1]]})
    await expect_error(comm, "bad_json")
    await still_open(comm)
    assert await snapshot(conv) == before
    await comm.disconnect()
