"""A chat's own settings through the real generation service (the real engine on the
tiny model, the database, the embedded dispatch): its temperature is what the engine
gets, chats on one personal preset share its system blocks, and a system prompt or model
changed mid-chat applies from the next turn, whose receipt says why the cache was cold."""

from __future__ import annotations

import uuid

import pytest
from channels.db import database_sync_to_async

from chatapp.chat import chat_settings, services
from chatapp.chat.models import Message
from chatapp.generation import chat_sampling, jobs, replies
from chatapp.generation.embedded import get_tokenizer
from chatapp.prompts.profile import recent_prompts
from chatapp.prompts.services import builder_for
from tests.inference.conftest import make_tiny_model

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

ALIAS, OTHER = "settings-tiny", "settings-tiny-b"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    return (make_tiny_model(tmp_path_factory.mktemp("tiny-settings-a"), "llama", seed=5),
            make_tiny_model(tmp_path_factory.mktemp("tiny-settings-b"), "llama", seed=6))


@pytest.fixture(autouse=True)
def tiny_chat(settings, tiny_models):
    settings.LLM_MODELS = f"{ALIAS}={tiny_models[0]},{OTHER}={tiny_models[1]}"
    settings.LLM_MAX_MODEL_LEN = 1024
    settings.LLM_NUM_BLOCKS = 256
    settings.CHAT_MAX_NEW_TOKENS = 16
    # The server's own sampling is random: only the chat's settings make a reply greedy.
    settings.CHAT_TEMPERATURE = 1.0
    settings.CHAT_TOP_P = 1.0


def unique_text() -> str:
    # A system prompt no earlier test has computed (the engine outlives tests).
    return f"You are Tester {uuid.uuid4().hex}. Answer briefly and plainly."


@database_sync_to_async
def start(owner, **kwargs):
    return chat_settings.conversation_start(owner=owner, model=ALIAS, **kwargs)


@database_sync_to_async
def update(conversation, **changes):
    return chat_settings.conversation_update_settings(conversation=conversation, changes=changes)


@database_sync_to_async
def send(conversation, content):
    return services.message_send(conversation=conversation, content=content)


@database_sync_to_async
def reload(message):
    return Message.objects.get(pk=message.pk)


async def turn(conversation, content) -> tuple[Message, Message]:
    user, reply = await send(conversation, content)
    final = await replies.run_reply(reply.pk)
    assert final["status"] == "done", final
    return await reload(user), await reload(reply)


def recorded_prompt(conversation, user: Message) -> list[int]:
    label = f"chat c{conversation.pk} u{user.pk}"
    return [list(p.token_ids) for p in recent_prompts() if p.label == label][-1]


async def greedy(prompt: list[int], max_tokens: int) -> list[int]:
    job = jobs.Job(prompt_ids=tuple(prompt), cache_salt="greedy-reference", model=ALIAS,
                   options=jobs.Options(default_max_tokens=max_tokens, temperature=0.0))
    generation = jobs.Generation(job, jobs.run_here)
    async for _ in generation.outputs():
        pass
    return generation.choices[0].token_ids


async def test_the_chat_s_temperature_is_what_the_engine_gets(alice):
    conversation = await start(alice, changes={"temperature": 0.0, "top_p": 0.5,
                                               "max_new_tokens": 12})
    options = chat_sampling.reply_options(conversation)
    assert (options.temperature, options.top_p, options.default_max_tokens) == (0.0, 0.5, 12)
    params = jobs.sampling_params(jobs.Job(prompt_ids=(1, 2, 3), cache_salt="s", options=options),
                                  max_model_len=1024, tokenizer=get_tokenizer(ALIAS))
    assert params.temperature == 0.0 and params.top_p == 0.5 and params.max_tokens == 12

    user, reply = await turn(conversation, "Name three colours and say why you like them.")
    # Temperature 0 is the greedy reply, token for token, whatever the server's default.
    assert reply.generated_token_ids == await greedy(recorded_prompt(conversation, user), 12)
    assert 1 <= reply.completion_tokens <= 12


async def test_chats_on_one_personal_preset_share_its_system_blocks(alice):
    preset = await database_sync_to_async(chat_settings.user_preset_create)(
        owner=alice, name="Terse", values={"system_prompt": unique_text(), "temperature": 0.0})
    first = await start(alice, user_preset_id=preset.pk)
    assert first.system_prompt == preset.system_prompt and first.user_preset_id == preset.pk
    await turn(first, "Hello there.")
    second = await start(alice, user_preset_id=preset.pk)
    _, reply = await turn(second, "Something else entirely.")
    system = builder_for(get_tokenizer(ALIAS)).system_segment_for_text(preset.system_prompt)
    assert len(system) % 16 == 0
    assert reply.prefix_cache["reason"] == "full"
    assert reply.cached_tokens >= len(system) == reply.prefix_cache["matched_tokens"]


async def test_a_system_prompt_changed_mid_chat_applies_from_the_next_turn(alice):
    conversation = await start(alice, changes={"system_prompt": unique_text(),
                                               "temperature": 0.0})
    await turn(conversation, "First question?")
    new_text = unique_text()
    conversation = await update(conversation, system_prompt=new_text)
    user, reply = await turn(conversation, "Second question?")
    system = builder_for(get_tokenizer(ALIAS)).system_segment_for_text(new_text)
    assert recorded_prompt(conversation, user)[:len(system)] == system
    assert reply.prefix_cache["changed"] == ["system prompt"]
    assert reply.prefix_cache["reason"] == "cold" and reply.cached_tokens == 0
    # The turn after extends that prompt again.
    _, after = await turn(conversation, "Third question?")
    assert "changed" not in after.prefix_cache and after.prefix_cache["reason"] == "full"


async def test_a_model_changed_mid_chat_reads_earlier_turns_from_their_text(alice):
    conversation = await start(alice, changes={"system_prompt": unique_text(),
                                               "temperature": 0.0})
    first_user, first = await turn(conversation, "Which model are you?")
    conversation = await update(conversation, model=OTHER)
    user, reply = await turn(conversation, "And now?")
    assert reply.model == OTHER and first.model == ALIAS
    assert reply.prefix_cache["changed"] == ["model"]
    builder = builder_for(get_tokenizer(OTHER))
    system = builder.system_segment_for_text(conversation.system_prompt)
    expected = (system + builder.user_segment(first_user.content, after_system=True)
                + builder.assistant_segment_from_text(first.content))
    assert recorded_prompt(conversation, user)[:len(expected)] == expected
    _, after = await turn(conversation, "Once more?")
    assert "changed" not in after.prefix_cache and after.prefix_cache["reason"] == "full"
