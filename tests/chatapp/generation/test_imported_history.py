"""An imported conversation (no token ids yet) answers through the real generation
service (the real engine on the tiny model): its messages are encoded once from their
text, the ids are stored, and the next turn's prompt extends them, so the prefix cache
serves the imported history to its last whole block."""

from __future__ import annotations

import uuid

import pytest
from channels.db import database_sync_to_async

from chatapp.chat import imports, services
from chatapp.chat.models import Message
from chatapp.generation import replies
from chatapp.generation.embedded import get_tokenizer
from chatapp.generation.served_models import conversation_model
from chatapp.prompts.services import builder_for
from tests.chatapp.api.import_files import chatgpt_with_branch
from tests.inference.conftest import make_tiny_model

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

BLOCK = 16


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-import"), "llama", seed=7)


@pytest.fixture(autouse=True)
def tiny_chat(settings, tiny_model):
    settings.LLM_MODELS = f"import-tiny={tiny_model}"
    settings.LLM_MAX_MODEL_LEN = 1024
    settings.LLM_NUM_BLOCKS = 256
    settings.CHAT_MAX_NEW_TOKENS = 8


@database_sync_to_async
def import_one(owner):
    # A question no earlier test has computed (the engine outlives tests).
    data = chatgpt_with_branch(f"Imported {uuid.uuid4().hex}")
    data["mapping"]["q1"]["message"]["content"]["parts"] = [f"Question {uuid.uuid4().hex}?"]
    (conversation,) = imports.conversations_import(
        owner=owner, conversations=imports.parse_export([data]), model=conversation_model(None))
    return conversation


@database_sync_to_async
def send(conversation, content):
    return services.message_send(conversation=conversation, content=content)


@database_sync_to_async
def branch_ids(conversation) -> list[list[int]]:
    """The stored ids of the imported branch on screen (root .. the current leaf)."""
    leaf = Message.objects.get(pk=conversation.current_leaf_id)
    path = []
    while leaf is not None:
        path.append(list(leaf.token_ids))
        leaf = leaf.parent
    return path[::-1]


@database_sync_to_async
def reload(message):
    return Message.objects.get(pk=message.pk)


async def turn(conversation, content) -> Message:
    _, reply = await send(conversation, content)
    final = await replies.run_reply(reply.pk)
    assert final["status"] == "done", final
    return await reload(reply)


async def test_an_imported_conversation_answers_and_its_history_is_then_cached(alice):
    conversation = await import_one(alice)
    imported = await branch_ids(conversation)
    assert len(imported) == 4 and not any(imported)  # nothing encoded at import

    first = await turn(conversation, "And the capital of Spain?")
    assert first.content
    encoded = (await branch_ids(conversation))[:4]  # then the new question and its reply
    assert all(encoded), "every imported message on the branch keeps its ids now"

    builder = builder_for(get_tokenizer(conversation.model))
    system = builder.system_segment(conversation.preset_id, conversation.preset_version or None,
                                    conversation.preset_variables or None)
    history = len(system) + sum(len(ids) for ids in encoded)

    second = await turn(conversation, "And of Italy?")
    assert second.prefix_cache["reason"] != "cold"
    assert second.cached_tokens >= history // BLOCK * BLOCK
    # The ids stay what the first turn stored (encoded once, never again).
    assert (await branch_ids(conversation))[:4] == encoded
