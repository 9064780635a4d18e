"""The generation service on its own: the real engine, the real database, the real
channel layer (no consumer in between)."""

import asyncio
import contextlib

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from chatapp.chat import services
from chatapp.chat.models import Message
from chatapp.generation import replies as generation
from chatapp.generation.embedded import get_engine
from chatapp.generation.events import DeltaBatcher
from chatapp.generation.runs import ReplyRun
from chatapp.prompts.profile import recent_prompts
from chatapp.prompts.services import PromptBuilder

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def small_replies(settings):
    settings.CHAT_MAX_NEW_TOKENS = 10
    settings.CHAT_TEMPERATURE = 0.0
    settings.CHAT_STREAM_BATCH_TOKENS = 3


send = database_sync_to_async(services.message_send)


@database_sync_to_async
def reload(message):
    return Message.objects.get(pk=message.pk)


def recorded_prompt(conversation, user_msg):
    label = f"chat c{conversation.pk} u{user_msg.pk}"
    return [list(p.token_ids) for p in recent_prompts() if p.label == label][-1]


async def test_each_turn_extends_the_last_token_for_token(alice):
    conv = await database_sync_to_async(services.conversation_create)(owner=alice)
    turns = []
    for text in ["Name a planet.", "Name a star.", "Name a moon."]:
        user_msg, reply = await send(conversation=conv, content=text)
        final = await generation.run_reply(reply.pk)
        assert final["status"] == "done"
        turns.append((user_msg, await reload(reply)))

    prompts = [recorded_prompt(conv, u) for u, _ in turns]
    tokenizer = get_engine().tokenizer
    header = len(PromptBuilder(tokenizer, block_size=16).generation_prompt())
    for (_, reply), before, after in zip(turns, prompts, prompts[1:], strict=False):
        assert after[: len(before)] == before
        # The reply enters the next prompt as exactly the ids the engine generated...
        generated = [t for t in reply.generated_token_ids if t not in tokenizer.all_special_ids]
        assert after[len(before): len(before) + len(generated)] == generated
        # ...inside the segment stored with it (its header ended the previous prompt).
        start = len(before) - header
        assert after[start: start + len(reply.token_ids)] == reply.token_ids
    last = turns[-1][1]
    assert last.cached_tokens >= (len(prompts[1]) // 16) * 16


async def listened_reply(owner):
    """A new conversation of owner's with one pending reply, and a channel in its group."""
    conv = await database_sync_to_async(services.conversation_create)(owner=owner)
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(conv.group_name, channel)
    _, reply = await send(conversation=conv, content="Say something nice.")
    return conv, reply, layer, channel


async def test_events_reach_the_group_in_order_with_the_final_usage(alice):
    conv, reply, layer, channel = await listened_reply(alice)
    final = await generation.run_reply(reply.pk)

    events = []
    while not events or events[-1]["type"] != "message.done":
        events.append((await asyncio.wait_for(layer.receive(channel), 60))["event"])
    assert events[0] == {"type": "message.started", "message_id": reply.pk,
                         "prompt_tokens": final["usage"]["prompt_tokens"], "text": ""}
    deltas = [e for e in events if e["type"] == "message.delta"]
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
    assert events[-1]["seq"] == len(deltas) + 1 and events[-1]["message"] == final
    assert "".join(d["text"] for d in deltas) == final["content"]
    await layer.group_discard(conv.group_name, channel)


async def test_the_done_event_survives_a_heartbeat_that_lands_on_the_final_write(alice,
                                                                               monkeypatch):
    """A heartbeat that runs just after the reply's own final write finds the row no
    longer active, and concludes so before the reply publishes: the page must still get
    message.done (with thirty clients at once, one hung without it)."""
    write_final = ReplyRun.write_final

    def write_then_heartbeat(run, fields):
        done = write_final(run, fields)
        assert not run.beaten(run.persist(None))  # refused: the row is done; no takeover
        return done

    monkeypatch.setattr(ReplyRun, "write_final", write_then_heartbeat)
    conv, reply, layer, channel = await listened_reply(alice)
    final = await generation.run_reply(reply.pk)
    assert final["status"] == "done"
    events = []
    while not events or events[-1]["type"] != "message.done":
        events.append((await asyncio.wait_for(layer.receive(channel), 10))["event"])
    assert events[-1]["message"] == final
    await layer.group_discard(conv.group_name, channel)


async def test_a_final_write_refused_to_a_superseded_generation_stays_silent(alice,
                                                                            monkeypatch):
    """Where another generation holds the reply, this one's result is dropped and no
    message.done of it is published."""
    from chatapp.generation import lifecycle

    monkeypatch.setattr(lifecycle, "reply_finish_held", lambda **kw: None)
    conv, reply, layer, channel = await listened_reply(alice)
    assert await generation.run_reply(reply.pk) == {}
    events = []
    with contextlib.suppress(asyncio.TimeoutError):
        while True:
            events.append((await asyncio.wait_for(layer.receive(channel), 0.5))["event"])
    assert events and all(e["type"] != "message.done" for e in events)
    await layer.group_discard(conv.group_name, channel)


async def test_a_stop_before_the_first_token_ends_the_reply_as_stopped(alice):
    conv = await database_sync_to_async(services.conversation_create)(owner=alice)
    _, reply = await send(conversation=conv, content="Tell me a long story.")
    task = asyncio.create_task(generation.run_reply(reply.pk))
    await asyncio.sleep(0)  # let the task start (and register as running)
    generation.stop_reply(reply.pk)
    final = await task
    assert final["status"] == "stopped" and final["finish_reason"] == "abort"
    stored = await reload(reply)
    assert stored.status == "stopped" and len(stored.generated_token_ids) <= 1
    metrics = get_engine().metrics()
    assert metrics["num_running"] == 0 and metrics["blocks_used"] == 0
    # The conversation is free again.
    _, nxt = await send(conversation=conv, content="Short, then.")
    assert (await generation.run_reply(nxt.pk))["status"] == "done"


async def test_a_running_reply_is_persisted_as_it_streams(alice, settings):
    """Each heartbeat stores the text, ids and segment so far: a crash loses at most one."""
    settings.CHAT_MAX_NEW_TOKENS = 40
    settings.CHAT_HEARTBEAT_S = 0.05
    conv = await database_sync_to_async(services.conversation_create)(owner=alice)
    _, reply = await send(conversation=conv, content="Count from one to twenty in words.")
    seen = []

    async def watch():
        while True:
            row = await reload(reply)
            if row.status == Message.Status.STREAMING and row.generated_token_ids:
                seen.append(row)
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    final = await generation.run_reply(reply.pk)
    watcher.cancel()
    assert final["status"] == "done" and seen, "no partial reply was ever persisted"
    partial = seen[-1]
    done = await reload(reply)
    n = len(partial.generated_token_ids)
    assert done.generated_token_ids[:n] == partial.generated_token_ids
    assert done.content.startswith(partial.content) and partial.content
    assert partial.completion_tokens == n and partial.prompt_tokens == final["usage"][
        "prompt_tokens"]
    tokenizer = get_engine().tokenizer
    builder = PromptBuilder(tokenizer, block_size=16)
    assert partial.token_ids == builder.assistant_segment(partial.generated_token_ids, False)


async def test_continue_generates_on_after_the_kept_ids_from_the_cache(alice, settings):
    settings.CHAT_MAX_NEW_TOKENS = 12
    conv = await database_sync_to_async(services.conversation_create)(owner=alice)
    _, reply = await send(conversation=conv, content="Count from one to twenty in words.")
    first = await generation.run_reply(reply.pk)
    assert first["finish_reason"] == "length"
    kept = await reload(reply)
    await database_sync_to_async(services.message_continue)(
        conversation=conv, message_id=reply.pk)
    final = await generation.run_reply(reply.pk)
    done = await reload(reply)
    assert final["status"] == "done" and done.content.startswith(kept.content)
    assert len(done.content) > len(kept.content)
    assert done.generated_token_ids[: len(kept.generated_token_ids)] == kept.generated_token_ids
    assert len(done.generated_token_ids) > len(kept.generated_token_ids)
    # The prompt went on after the kept ids, and the cache served the earlier prompt.
    assert done.prompt_tokens == kept.prompt_tokens + len(kept.generated_token_ids)
    assert done.cached_tokens >= (kept.prompt_tokens // 16) * 16


def test_deltas_are_batched_by_token_count():
    batcher = DeltaBatcher(batch_tokens=3, flush_s=float("inf"))
    batcher.add("a", 1)
    batcher.add("b", 1)
    assert not batcher.due()
    batcher.add("c", 1)
    assert batcher.due() and batcher.take() == (1, "abc")
    assert not batcher.due()
    batcher.add("", 1)
    assert not batcher.due()  # nothing visible to send yet


async def test_prewarm_loads_nothing_without_a_kv_tier(alice, settings, monkeypatch):
    """Without a host/disk tier nothing can come back, so opening a conversation neither
    loads the model nor queries its history; with one it goes to the engine."""
    asked = []

    async def engine_wanted(model=None):
        asked.append(model)
        raise LookupError("the engine was asked for")

    monkeypatch.setattr(generation, "aget_engine", engine_wanted)
    conv = await database_sync_to_async(services.conversation_create)(owner=alice)
    settings.LLM_KV_DIR, settings.LLM_KV_OFFLOAD_BYTES = None, None
    assert await generation.prewarm(conv) == 0 and not asked
    settings.LLM_KV_DIR = "/nonexistent"
    with pytest.raises(LookupError):
        await generation.prewarm(conv)
