"""Titles the model writes (CHAT_TITLES), through the real generation service (the real
engine, the database, the embedded dispatch, the in-memory channel layer): asked for once
after a conversation's first reply, generated as a continuation of its cached prompt,
announced after the reply's message.done, and never over a user's rename.

The model is the tiny random one (SmolLM2's tokenizer): what a title says does not
matter here, only that it is the model's, where its tokens come from, and when it lands."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from chatapp.chat import services
from chatapp.chat.models import Conversation, GeneratedTitle, Message
from chatapp.generation import background, replies, titles
from chatapp.prompts.titles import MAX_TOKENS
from tests.inference.conftest import make_tiny_model

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

ALIAS = "title-tiny"
BLOCK = 16
QUESTION = "How does a prefix cache make the next turn of a chat cheaper to answer?"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-title"), "llama", seed=3)


@pytest.fixture(autouse=True)
def tiny_chat(settings, tiny_model):
    """Chats on the tiny model with short greedy replies, titles on."""
    settings.LLM_MODELS = f"{ALIAS}={tiny_model}"
    settings.LLM_MAX_MODEL_LEN = 1024
    settings.LLM_NUM_BLOCKS = 256
    settings.CHAT_MAX_NEW_TOKENS = 24
    settings.CHAT_TEMPERATURE = 0.0
    settings.CHAT_TITLES = True


@database_sync_to_async
def new_conversation(owner, title: str = "") -> Conversation:
    return services.conversation_create(owner=owner, title=title)


@database_sync_to_async
def send(conversation, content):
    return services.message_send(conversation=conversation, content=content)


@database_sync_to_async
def reload(obj):
    return type(obj).objects.get(pk=obj.pk)


@database_sync_to_async
def title_rows(conversation) -> list[GeneratedTitle]:
    return list(GeneratedTitle.objects.filter(conversation=conversation))


async def turn(conversation, content: str = QUESTION) -> Message:
    """One turn: the reply, then whatever background generation it started."""
    user, reply = await send(conversation, content)
    final = await replies.run_reply(reply.pk)
    assert final["status"] == "done", final
    await background.settled()
    return await reload(reply)


class GroupListener:
    """The events a page watching the conversation receives, in order."""

    def __init__(self, conversation):
        self.layer = get_channel_layer()
        self.group = conversation.group_name

    async def __aenter__(self):
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.group, self.channel)
        return self

    async def __aexit__(self, *exc):
        await self.layer.group_discard(self.group, self.channel)

    async def events(self) -> list[dict]:
        """Everything received so far: drained up to a marker sent after it."""
        await self.layer.send(self.channel, {"type": "listener.end"})
        out = []
        while (message := await self.layer.receive(self.channel))["type"] != "listener.end":
            out.append(message["event"])
        return out


async def test_the_first_reply_gets_a_title_from_its_cached_prompt_after_message_done(alice):
    conversation = await new_conversation(alice)
    async with GroupListener(conversation) as page:
        reply = await turn(conversation)
        events = await page.events()
    (row,) = await title_rows(conversation)
    assert row.status == GeneratedTitle.Status.READY, row.error
    assert row.reply_id == reply.pk and row.replaces == services.auto_title(QUESTION)
    conversation = await reload(conversation)
    assert conversation.title == row.text and row.text != row.replaces
    # The reply is announced done before the title arrives, and the title once.
    kinds = [(e["type"], e.get("message_id")) for e in events]
    done = kinds.index(("message.done", reply.pk))
    titled = [i for i, e in enumerate(events) if e["type"] == "conversation.title"]
    assert len(titled) == 1 and titled[0] > done
    assert events[titled[0]] == {"type": "conversation.title",
                                 "conversation_id": conversation.pk, "title": row.text}
    # Its request extends the conversation's prompt: every whole block of the reply's
    # prompt (and of the reply) comes from the prefix cache; it pays for its own tokens.
    assert row.cached_tokens >= reply.prompt_tokens // BLOCK * BLOCK
    assert row.prompt_tokens > reply.prompt_tokens + len(reply.generated_token_ids or [])
    assert 0 < row.completion_tokens <= MAX_TOKENS

    # Later replies ask for no other title.
    async with GroupListener(conversation) as page:
        await turn(conversation, "And what happens when the pool runs out of blocks?")
        events = await page.events()
    assert [r.pk for r in await title_rows(conversation)] == [row.pk]
    assert not [e for e in events if e["type"] == "conversation.title"]
    assert (await reload(conversation)).title == row.text


@database_sync_to_async
def ask_title(reply_id: int) -> int | None:
    return titles.ask(reply_id)


@database_sync_to_async
def rename(conversation, title: str) -> None:
    services.conversation_rename(conversation=conversation, title=title)


@database_sync_to_async
def renamed_behind_its_back(conversation, title: str) -> None:
    """A rename that lands after the title was claimed (another process's)."""
    Conversation.objects.filter(pk=conversation.pk).update(title=title)


async def test_a_rename_before_the_title_arrives_wins(alice, settings):
    settings.CHAT_TITLES = False  # the reply alone; the title is asked for by hand below
    for renamed in (rename, renamed_behind_its_back):
        conversation = await new_conversation(alice)
        reply = await turn(conversation)
        settings.CHAT_TITLES = True
        title_id = await ask_title(reply.pk)
        assert title_id is not None
        await renamed(conversation, "Mine")
        async with GroupListener(conversation) as page:
            status = await titles.generate(title_id)
            events = await page.events()
        assert status == GeneratedTitle.Status.DROPPED
        assert (await reload(conversation)).title == "Mine"
        assert not [e for e in events if e["type"] == "conversation.title"]
        settings.CHAT_TITLES = False


async def test_a_conversation_its_user_named_keeps_its_name(alice):
    conversation = await new_conversation(alice, title="Cache notes")
    await turn(conversation)
    assert not await title_rows(conversation)
    assert (await reload(conversation)).title == "Cache notes"


async def test_off_when_chat_titles_is_off(alice, settings):
    settings.CHAT_TITLES = False
    conversation = await new_conversation(alice)
    await turn(conversation)
    assert not await title_rows(conversation)
    assert (await reload(conversation)).title == services.auto_title(QUESTION)
