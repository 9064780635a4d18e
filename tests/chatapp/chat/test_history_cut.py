"""A chat longer than its context, through the real chat path (WebSocket, SmolLM2, the
database): every turn answers, the oldest whole turns are left out in large steps, each
cut is the one miss its receipt explains, and nothing stored is deleted."""

import uuid

import pytest
from channels.db import database_sync_to_async

from chatapp.chat import selectors
from chatapp.chat.models import Message
from chatapp.generation.embedded import get_tokenizer
from chatapp.generation.prompting import conversation_prompt_ids
from chatapp.prompts.services import builder_for

from .test_consumer import get_message
from .test_receipts import fresh_conversation, open_chat, turn
from .wsclient import receive

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

CONTEXT = 512
TURNS = 20
QUESTIONS = (
    "Which colour do you get when you mix blue and yellow paint together on a palette?",
    "Name one animal that lives in the sea and one that lives in the desert, please.",
    "What is the capital of France, and which river runs through the middle of it?",
    "How many legs does a spider have, compared with an ordinary insect like an ant?",
)


@database_sync_to_async
def stored(conv):
    return list(Message.objects.filter(conversation=conv).order_by("id")
                .values_list("id", "role", "content"))


def prompt_ids(conv):
    return conversation_prompt_ids(tokenizer=get_tokenizer(), conversation=conv)


@database_sync_to_async
def branch_ids(conv):
    return [m.pk for m in selectors.current_branch(conversation=conv)]


async def test_a_long_chat_cuts_whole_turns_once_in_a_while_and_keeps_everything(
        alice, settings):
    settings.CHAT_CONTEXT_TOKENS = CONTEXT
    conv = await fresh_conversation(alice, f"Long{uuid.uuid4().hex[:8]}")
    comm = await open_chat(conv, alice)
    cuts = misses = 0
    cacheable = 0
    first_seen = None
    for n in range(TURNS):
        reply, receipt = await turn(comm, f"{n + 1}. {QUESTIONS[n % len(QUESTIONS)]}")
        assert reply.status == Message.Status.DONE, reply.error
        assert reply.prompt_tokens + 12 <= CONTEXT
        cut = receipt.get("history_cut")
        if n:
            miss = reply.cached_tokens < 0.9 * cacheable
            misses += miss
            assert miss == bool(cut and cut["new"]), (n, receipt)
        if cut is not None:
            ids = await branch_ids(conv)
            # Whole turns: the first message the model still sees is a user message.
            assert cut["first_message_id"] == ids[cut["messages"]]
            assert cut["messages"] == 2 * cut["turns"] and cut["tokens"] > 0
            first_seen = cut["first_message_id"]
            if cut["new"]:
                cuts += 1
                # The one miss is explained: the prompt differs from the marker on.
                assert receipt["reason"] == "diverged"
                assert receipt["diverged_segment"] == "history cut"
                assert reply.prompt_tokens <= CONTEXT // 2
            else:
                assert receipt["reason"] == "full"
        cacheable = (reply.prompt_tokens + reply.completion_tokens - 1) // 16 * 16
    assert cuts >= 2 and misses == cuts
    assert (await get_message(first_seen)).role == Message.Role.USER

    # What a prewarm brings back is the cut prompt the next turn extends: the system
    # segment, the marker, the kept turns and the last reply.
    ids = await database_sync_to_async(prompt_ids)(conv)
    builder = builder_for(get_tokenizer())
    header = len(builder.generation_prompt())
    assert len(ids) == reply.prompt_tokens - header + len(reply.token_ids)
    system = len(builder.system_segment(conv.preset_id, conv.preset_version,
                                        conv.preset_variables))
    assert ids[system:system + len(builder.marker_segment())] == builder.marker_segment()

    # Nothing stored was deleted or altered: every turn, every message as written.
    messages = await stored(conv)
    assert len(messages) == 2 * TURNS
    users = [content for _, role, content in messages if role == "user"]
    assert users == [f"{n + 1}. {QUESTIONS[n % len(QUESTIONS)]}" for n in range(TURNS)]

    # A message that alone cannot fit is refused before anything is stored.
    await comm.send_json_to({"type": "send", "content": "Explain this. " * 300})
    error = await receive(comm)
    assert error["type"] == "error" and error["code"] == "context_length_exceeded"
    assert f"holds {CONTEXT}" in error["message"], error
    assert await stored(conv) == messages

    # Editing the first message (above the divider) still branches from it, uncut.
    await comm.send_json_to({"type": "edit", "message_id": messages[0][0],
                             "content": "Name a colour."})
    from .wsclient import created_reply_id, is_done, receive_until

    events = await receive_until(comm, is_done)
    edited = await get_message(created_reply_id(events))
    assert edited.status == Message.Status.DONE
    assert "history_cut" not in edited.prefix_cache
    assert len(await stored(conv)) == 2 * TURNS + 2
    await comm.disconnect()
