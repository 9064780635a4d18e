"""Summaries of the turns a history cut leaves out (CHAT_HISTORY_SUMMARY), through the
real generation service (the real engine, the database, the embedded dispatch): asked
for once per cut, generated after the reply that made the cut, stored, then shown after
the marker token for token, so every turn between cuts is still a cache hit. Off by
default; a summary that fails leaves the marker alone standing.

The model is the tiny random one (SmolLM2's tokenizer): what a summary says does not
matter here, only where its tokens go."""

from __future__ import annotations

import random
import shutil

import pytest
from channels.db import database_sync_to_async
from django.conf import settings as django_settings

from chatapp.chat import selectors, services
from chatapp.chat.models import HistorySummary, Message
from chatapp.generation import replies, summaries
from chatapp.generation.embedded import get_tokenizer
from chatapp.prompts.presets import templates_dir
from chatapp.prompts.profile import recent_prompts
from chatapp.prompts.services import builder_for
from tests.inference.conftest import make_tiny_model

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

ALIAS = "summary-tiny"
CONTEXT = 1024
ROOM = 64
TEXT = ("the cache keeps every block whose whole prefix it computed before so a chat that "
        "extends its prompt pays only for new tokens")
WORDS = TEXT.split(" ")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-summary"), "llama", seed=3)


@pytest.fixture(autouse=True)
def tiny_chat(settings, tiny_model):
    """Chats on the tiny model with a 1,024-token context and short replies."""
    settings.LLM_MODELS = f"{ALIAS}={tiny_model}"
    settings.LLM_MAX_MODEL_LEN = CONTEXT
    settings.LLM_NUM_BLOCKS = 256
    settings.CHAT_MAX_NEW_TOKENS = 24
    settings.CHAT_TEMPERATURE = 0.0
    settings.CHAT_HISTORY_SUMMARY_TOKENS = ROOM


def question(rng: random.Random, n: int) -> str:
    return f"{n + 1}. " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))) + "?"


@database_sync_to_async
def new_conversation(owner):
    return services.conversation_create(owner=owner)


@database_sync_to_async
def send(conversation, content):
    return services.message_send(conversation=conversation, content=content)


@database_sync_to_async
def reload(message):
    return Message.objects.get(pk=message.pk)


@database_sync_to_async
def summary_rows(conversation) -> dict[int, HistorySummary]:
    return {s.last_left_out_id: s for s in HistorySummary.objects.filter(conversation=conversation)}


@database_sync_to_async
def last_left_out(reply: Message, cut: dict) -> int:
    return selectors.message_path(message=reply)[cut["messages"] - 1].pk


@database_sync_to_async
def message_count(conversation) -> int:
    return Message.objects.filter(conversation=conversation).count()


def recorded_prompt(conversation, user: Message) -> list[int]:
    label = f"chat c{conversation.pk} u{user.pk}"
    return [list(p.token_ids) for p in recent_prompts() if p.label == label][-1]


async def chat(owner, turns: int, *, until_cuts: int | None = None) -> list[dict]:
    """A conversation of `turns` turns (or until `until_cuts` cuts and one turn more),
    each turn waiting for any summary it started; per turn: the reply, its receipt, its
    prompt, and whether it missed the cache (cached < 90 % of what the last turn left)."""
    conversation = await new_conversation(owner)
    rng = random.Random(5)
    out: list[dict] = []
    cacheable = 0
    header = len(builder_for(get_tokenizer(ALIAS)).generation_prompt())
    for n in range(turns):
        user, reply = await send(conversation, question(rng, n))
        final = await replies.run_reply(reply.pk)
        assert final["status"] == "done", final
        await summaries.settled()
        reply = await reload(reply)
        prompt = recorded_prompt(conversation, user)
        out.append({"conversation": conversation, "reply": reply, "prompt": prompt,
                    "receipt": reply.prefix_cache, "cut": reply.prefix_cache.get("history_cut"),
                    "miss": bool(n) and reply.cached_tokens < 0.9 * cacheable})
        previous = prompt[:-header] + reply.token_ids
        cacheable = (len(previous) - 1) // 16 * 16
        if until_cuts is not None and sum(bool(t["cut"] and t["cut"]["new"]) for t in out) > until_cuts:
            break
    return out


def _prefix(conversation) -> tuple[list[int], list[int]]:
    builder = builder_for(get_tokenizer(ALIAS))
    system = builder.system_segment(conversation.preset_id, conversation.preset_version or None,
                                    conversation.preset_variables or None)
    return system, builder.marker_segment()


async def test_each_cut_is_summarised_once_and_shown_token_for_token_after_it(alice, settings):
    settings.CHAT_HISTORY_SUMMARY = True
    turns = await chat(alice, 60, until_cuts=3)
    conversation = turns[0]["conversation"]
    system, marker = _prefix(conversation)
    rows = await summary_rows(conversation)
    seen: dict[int, tuple] = {}  # a summary as first shown
    cuts = shown = 0
    for n, t in enumerate(turns):
        cut, prompt, receipt = t["cut"], t["prompt"], t["receipt"]
        first_shown = False
        if cut is not None:
            assert prompt[:len(system) + len(marker)] == system + marker
            summary = rows[await last_left_out(t["reply"], cut)]
            if cut["new"]:
                cuts += 1
                # Asked for at the cut, ready only after its reply: the marker alone.
                assert cut["summary_tokens"] == 0
            if cut["summary_tokens"]:
                assert summary.status == HistorySummary.Status.READY, summary.error
                after = prompt[len(system) + len(marker):]
                assert after[:len(summary.token_ids)] == summary.token_ids  # token for token
                assert cut["summary_tokens"] == len(summary.token_ids)
                key = (summary.token_ids, summary.text, summary.updated_at)
                first_shown = summary.pk not in seen
                assert seen.setdefault(summary.pk, key) == key  # it never changes
        if n:
            # A miss at each cut, and one where the cut's summary first shows (explained).
            assert t["miss"] == (bool(cut and cut["new"]) or first_shown), (n, receipt)
        if first_shown:
            shown += 1
            assert receipt["reason"] == "diverged", receipt
            assert receipt["diverged_segment"] == "history summary"
            start = len(system) + len(marker)
            assert start <= receipt["diverged_at"] < start + cut["summary_tokens"]
    assert cuts >= 3 and shown >= 3
    # One summary per cut, each within its room and whole blocks, each asked for once.
    assert len(rows) == cuts
    for summary in rows.values():
        assert summary.status == HistorySummary.Status.READY
        assert 0 < len(summary.token_ids) <= ROOM and len(summary.token_ids) % 16 == 0
        # Its request was the conversation's own prompt up to the cut: mostly cached.
        assert summary.cached_tokens >= summary.prompt_tokens // 2, summary
    # The turns after a summary shows fit the cut's target with it.
    for t in turns:
        if t["cut"] and t["cut"]["summary_tokens"]:
            assert t["reply"].prompt_tokens + 24 <= CONTEXT
    # Nothing stored was deleted or altered: every turn's two messages are there.
    assert await message_count(conversation) == 2 * len(turns)


async def test_off_by_default_the_marker_stands_alone(alice):
    assert django_settings.CHAT_HISTORY_SUMMARY is False
    turns = await chat(alice, 40, until_cuts=1)
    conversation = turns[0]["conversation"]
    cuts = [t["cut"] for t in turns if t["cut"]]
    assert cuts and all(cut["summary_tokens"] == 0 for cut in cuts)
    assert not await summary_rows(conversation)
    assert sum(t["miss"] for t in turns) == sum(cut["new"] for cut in cuts)


async def test_a_failed_summary_leaves_the_marker_alone_working(alice, settings, tmp_path):
    # A request template that cannot render: the summary fails where it is made.
    folder = tmp_path / "prompts"
    shutil.copytree(templates_dir(), folder)
    request = folder / "instructions" / "summarise_history.jinja"
    request.write_text(request.read_text().replace("{{ max_words }}", "{{ max_words.nope }}"))
    settings.PROMPT_TEMPLATES_DIR = str(folder)
    settings.CHAT_HISTORY_SUMMARY = True
    turns = await chat(alice, 60, until_cuts=2)
    conversation = turns[0]["conversation"]
    rows = await summary_rows(conversation)
    cuts = [t["cut"] for t in turns if t["cut"]]
    new_cuts = sum(cut["new"] for cut in cuts)
    assert new_cuts >= 2 and len(rows) == new_cuts  # each failed once, never asked again
    for summary in rows.values():
        assert summary.status == HistorySummary.Status.FAILED and summary.error
        assert not summary.token_ids
    # Every turn answered, behind the marker alone, missing the cache only at the cuts.
    assert all(cut["summary_tokens"] == 0 for cut in cuts)
    assert sum(t["miss"] for t in turns) == new_cuts


@database_sync_to_async
def left_by_a_dead_process(summary_id: int) -> None:
    """The row as a process that died while generating it leaves it."""
    HistorySummary.objects.filter(pk=summary_id).update(
        status=HistorySummary.Status.RUNNING, token_ids=[], text="")


async def test_a_summary_its_process_left_unfinished_is_asked_for_again(alice, settings):
    settings.CHAT_HISTORY_SUMMARY = True
    turns = await chat(alice, 40, until_cuts=0)
    conversation = turns[-1]["conversation"]
    (summary,) = (await summary_rows(conversation)).values()
    await left_by_a_dead_process(summary.pk)
    settings.CHAT_STALE_REPLY_S = 0
    for n in range(2):
        user, reply = await send(conversation, f"And one more thing, number {n}?")
        assert (await replies.run_reply(reply.pk))["status"] == "done"
        await summaries.settled()
    (again,) = (await summary_rows(conversation)).values()
    assert again.pk == summary.pk and again.status == HistorySummary.Status.READY, again.error
    reply = await reload(reply)
    assert reply.prefix_cache["history_cut"]["summary_tokens"] == len(again.token_ids)
