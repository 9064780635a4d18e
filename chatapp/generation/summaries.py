"""Summaries of the turns a history cut leaves out (CHAT_HISTORY_SUMMARY; the prompt side:
chatapp.prompts.summaries).

A reply whose prompt cuts history that has no summary yet asks for one (`ask`, while its
prompt is prepared); once that reply has ended, `start` hands the summary to a Celery
worker when dispatch says so, else generates it on this process's engine once that is
idle. It is generated once: the row is claimed (pending -> running) before any work, and
a ready or failed row is never written again. One left unfinished for CHAT_STALE_REPLY_S
(its process died) is asked for again by the next turn of its cut. Until it is ready, prompts show the marker
alone; from the first prompt built after, they show its stored ids after the marker.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from chatapp.chat import selectors
from chatapp.chat.models import HistorySummary, Message
from chatapp.generation import background, dispatch, prompting
from chatapp.generation.embedded import aget_engine
from chatapp.generation.jobs import Job, Options
from chatapp.prompts.services import builder_for, cache_salt_for
from chatapp.prompts.summaries import (
    max_summary_tokens,
    max_summary_words,
    request_text,
    summaries_enabled,
    summary_segment,
)

log = logging.getLogger(__name__)

Status = HistorySummary.Status

class SummaryFailed(Exception):
    """A summary that cannot be made; the marker alone stands for its cut."""


def ask(*, conversation, plan, path: list[Message]) -> int | None:
    """The summary `plan`'s cut asks for: its id when this call created it (pending), or
    found it stale, for the caller to `start`; None when summaries are off, the prompt
    cuts nothing, or the cut has one already (ready, failed, or on its way)."""
    cut = plan.cut
    if cut is None or cut.summary_tokens or not summaries_enabled():
        return None
    summary, created = HistorySummary.objects.get_or_create(
        last_left_out=path[cut.messages - 1],
        defaults={"conversation": conversation, "messages": cut.messages},
    )
    if created:
        return summary.pk
    stale = timezone.now() - timedelta(seconds=settings.CHAT_STALE_REPLY_S)
    # Its claim lapses: whichever generation stores first wins, the other writes nothing.
    reset = HistorySummary.objects.filter(
        pk=summary.pk, status__in=(Status.PENDING, Status.RUNNING), updated_at__lt=stale,
    ).update(status=Status.PENDING, updated_at=timezone.now())
    return summary.pk if reset else None


async def start(summary_id: int, *, reply_id: int, detached: bool = True) -> None:
    """Generate summary `summary_id`, asked for by reply `reply_id`'s cut: on a worker when
    dispatch says so, else here once the engine is idle (chatapp.generation.background)."""
    queued, model = await database_sync_to_async(_enqueue)(summary_id, reply_id)
    if not queued:
        await background.run_when_idle(lambda: generate(summary_id), model=model,
                                       detached=detached)


# Tests and shutdown wait for every background generation, summaries among them.
settled = background.settled


def _enqueue(summary_id: int, reply_id: int) -> tuple[bool, str]:
    reply = Message.objects.select_related("conversation").get(pk=reply_id)
    model = reply.conversation.model
    tokens = prompting.context_limit(model).summary_tokens
    return dispatch.enqueue_summary(summary_id=summary_id, max_tokens=tokens,
                                    preferred=reply.served_by, model=model), model


def _model_of(summary_id: int) -> str:
    return HistorySummary.objects.values_list("conversation__model", flat=True).get(
        pk=summary_id)


async def generate(summary_id: int) -> str:
    """Generate the pending summary `summary_id` on this process's engine and store it;
    its status after (a summary claimed or finished elsewhere is left as it is)."""
    if not await database_sync_to_async(_claim)(summary_id):
        return await database_sync_to_async(_status)(summary_id)
    try:
        model = await database_sync_to_async(_model_of)(summary_id)
        engine = await aget_engine(model)
        job, room = await database_sync_to_async(_job)(summary_id, engine.tokenizer)
        generation = await background.generate_here(job)
        choice = generation.choices[0]
        if choice.engine_reason not in ("stop", "length"):
            raise SummaryFailed(choice.error or f"the generation ended: {choice.engine_reason}")
        segment = summary_segment(builder_for(engine.tokenizer), choice.text, room)
        if segment is None:
            raise SummaryFailed("the model wrote no summary")
        await database_sync_to_async(_store)(
            summary_id, status=Status.READY, text=choice.text.strip(), token_ids=segment,
            prompt_tokens=generation.prompt_tokens, cached_tokens=generation.cached_tokens)
    except HistorySummary.DoesNotExist:
        return "gone"  # deleted with its conversation
    except Exception as exc:  # whatever it is, the marker alone still stands for the cut
        log.warning("History summary %s failed", summary_id, exc_info=True)
        error = str(exc) if isinstance(exc, SummaryFailed | prompting.PromptFailure) else (
            f"{type(exc).__name__}: {exc}")
        await database_sync_to_async(_store)(summary_id, status=Status.FAILED, error=error)
        return Status.FAILED
    return Status.READY


def _claim(summary_id: int) -> bool:
    return HistorySummary.objects.filter(pk=summary_id, status=Status.PENDING).update(
        status=Status.RUNNING, updated_at=timezone.now()) == 1


def _status(summary_id: int) -> str:
    return HistorySummary.objects.filter(pk=summary_id).values_list(
        "status", flat=True).first() or "gone"


def _job(summary_id: int, tokenizer) -> tuple[Job, int]:
    """The request for the summary, and the room its segment must fit."""
    summary = HistorySummary.objects.select_related("conversation", "last_left_out").get(
        pk=summary_id)
    conversation = summary.conversation
    room = prompting.context_limit(conversation.model).summary_tokens
    tokens = max_summary_tokens(builder_for(tokenizer), room)
    if tokens < 1:
        raise SummaryFailed(f"CHAT_HISTORY_SUMMARY_TOKENS ({room}) leaves no room for a summary")
    plan = prompting.build_summary_prompt(
        tokenizer=tokenizer, conversation=conversation,
        left_out=selectors.message_path(message=summary.last_left_out),
        request=request_text(max_summary_words(tokens)))
    # Greedy: one summary, stored for good, is the model's most likely account.
    options = Options(default_max_tokens=tokens, temperature=0.0)
    return Job(prompt_ids=plan.token_ids, cache_salt=cache_salt_for(conversation.owner),
               options=options, request_id=summary.request_id, model=conversation.model), room


def _store(summary_id: int, **fields) -> None:
    """The one write after the claim: a summary, once ready or failed, never changes."""
    HistorySummary.objects.filter(pk=summary_id, status=Status.RUNNING).update(
        updated_at=timezone.now(), **fields)
