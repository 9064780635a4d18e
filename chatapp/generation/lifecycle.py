"""A reply's life in the database: claimed by a generation, persisted by its heartbeat,
flagged to stop, marked streaming, finished (done, stopped, failed, or interrupted when
its process died: chatapp.generation.orphans).

Every process that generates replies (the web's embedded engine, Celery workers)
records through these functions, so a reply has one set of rules wherever it runs.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chatapp.chat import services as chat_services
from chatapp.chat.models import Message
from chatapp.generation.orphans import announce, runner_is_dead, this_runner

log = logging.getLogger(__name__)


def reply_persist(*, reply_id: int, runner: str, lease: str = "",
                  progress: dict | None = None) -> bool:
    """Touch a running reply and store `progress` (its text, ids and usage so far), so a
    crash loses at most one heartbeat of it; False when the reply is no longer this
    generation's (finished as interrupted, taken over, deleted)."""
    replies = Message.objects.filter(pk=reply_id, runner=runner, status__in=Message.ACTIVE)
    if lease:
        replies = replies.filter(lease=lease)  # a generation that lost its claim stays silent
    return bool(replies.update(updated_at=timezone.now(), **(progress or {})))


class Claim:
    """What a worker may do with a reply it was handed (see reply_claim)."""

    CLAIMED = "claimed"    # generate it, under the returned lease
    FINISHED = "finished"  # done, stopped or failed already: nothing to do
    BUSY = "busy"          # another live generation holds it: try again later
    GONE = "gone"          # deleted with its conversation


@transaction.atomic
def reply_claim(*, reply_id: int, holder: str, reclaim_own: bool = False) -> tuple[str, str]:
    """Take reply `reply_id` for generation by `holder` (a worker); returns (Claim, lease).

    The row lock makes one of several deliveries of a task win (docs/deployment.md,
    "Reliability and crash recovery"). `reclaim_own`: the holder runs one task at a time, so a reply it holds
    already lost its generation with its process (a killed pool child).
    """
    reply = (
        Message.objects.select_for_update()
        .filter(pk=reply_id, role=Message.Role.ASSISTANT)
        .first()
    )
    if reply is None:
        return Claim.GONE, ""
    if not reply.is_active:
        return Claim.FINISHED, ""
    if reply.status == Message.Status.STREAMING:
        # A copy of the task delivered again: its first generation is alive (busy), or
        # died, and the reply is finished as interrupted with the text it had.
        alive = reply.updated_at >= timezone.now() - timedelta(seconds=settings.CHAT_ORPHAN_S)
        if alive and not runner_is_dead(reply.runner) and not (
            reclaim_own and reply.served_by == holder
        ):
            return Claim.BUSY, ""
        ids = chat_services.replies_interrupt(replies=Message.objects.filter(pk=reply.pk))
        transaction.on_commit(lambda: announce(ids))  # its page waits for a message.done
        return Claim.FINISHED, ""
    if reply.stop_requested:
        reply_finish(reply=reply, status=Message.Status.STOPPED, finish_reason="abort")
        return Claim.FINISHED, ""
    reply.lease = uuid.uuid4().hex
    reply.served_by = holder
    reply.runner = this_runner()
    reply.status = Message.Status.STREAMING
    reply.save(update_fields=["lease", "served_by", "runner", "status", "updated_at"])
    return Claim.CLAIMED, reply.lease


def reply_request_stop(*, reply_id: int) -> bool:
    """Flag a reply generated elsewhere (a worker) to stop; its generation polls the flag."""
    return bool(
        Message.objects.filter(pk=reply_id, status__in=Message.ACTIVE).update(stop_requested=True)
    )


def reply_stop_requested(*, reply_id: int) -> bool:
    """True once a stop was asked for, or the reply was deleted with its conversation."""
    return not Message.objects.filter(pk=reply_id, stop_requested=False).exists()


def reply_take(*, reply_id: int) -> bool:
    """Name this process as the one generating reply `reply_id` (claimed by the web's own
    engine); False when it is no longer pending (stopped or deleted meanwhile)."""
    return bool(Message.objects.filter(pk=reply_id, status=Message.Status.PENDING).update(
        runner=this_runner(), updated_at=timezone.now()))


def reply_mark_streaming(*, reply: Message, served_by: str = "",
                         segment_token_ids: list[int] | None = None) -> bool:
    """The prompt is built: streaming from now on. `segment_token_ids`: the reply's segment
    as it stands (the header, or the ids a continued reply holds), so one interrupted
    before its first heartbeat still has ids for the next turn's prompt. False, nothing
    written, when the reply is no longer active (finished as interrupted meanwhile, say):
    a row that ended must not come back to life."""
    reply.status = Message.Status.STREAMING
    reply.served_by = served_by or reply.served_by
    fields = {"status": reply.status, "served_by": reply.served_by, "updated_at": timezone.now()}
    if segment_token_ids is not None:
        reply.token_ids = list(segment_token_ids)
        fields["token_ids"] = reply.token_ids
    return bool(Message.objects.filter(pk=reply.pk, status__in=Message.ACTIVE).update(**fields))


def reply_finish(
    *,
    reply: Message,
    status: str,
    content: str = "",
    generated_token_ids: list[int] | None = None,
    segment_token_ids: list[int] | None = None,
    prompt_tokens: int | None = None,
    cached_tokens: int | None = None,
    ttft: float | None = None,
    finish_reason: str = "",
    error: str = "",
    prefix_cache: dict | None = None,
) -> Message:
    """Record how a reply ended (done, stopped or error), with its ids and usage."""
    generated = list(generated_token_ids or [])
    reply.status = status
    reply.content = content
    reply.generated_token_ids = generated
    reply.token_ids = list(segment_token_ids or [])
    reply.prompt_tokens = prompt_tokens
    reply.cached_tokens = cached_tokens
    reply.completion_tokens = len(generated) if prompt_tokens is not None else None
    reply.ttft = ttft
    reply.finish_reason = finish_reason or ""
    reply.error = error
    reply.prefix_cache = prefix_cache
    reply.save()
    _account(reply)
    return reply


def _account(reply: Message) -> None:
    """Count a chat reply's usage once, as it ends (the chat page and /api have no key)."""
    from chatapp.accounting.services import ReplyUsage, reply_record

    reply_record(
        user=reply.conversation.owner, key=None,
        model=reply.model or reply.conversation.model,
        usage=ReplyUsage(prompt_tokens=reply.prompt_tokens or 0,
                         cached_tokens=reply.cached_tokens or 0,
                         completion_tokens=reply.completion_tokens or 0),
        error=reply.status == Message.Status.ERROR,
    )


def reply_finish_held(*, reply_id: int, lease: str = "", runner: str = "",
                      **fields) -> Message | None:
    """reply_finish for a generation holding `lease` (a worker's) and run by `runner`; None
    when another generation took the reply over, or it was finished meanwhile (as
    interrupted: its process looked dead): that record stands, this result is dropped."""
    with transaction.atomic():
        reply = Message.objects.select_for_update().get(pk=reply_id)
        if (lease and reply.lease != lease) or (runner and reply.runner != runner) or (
            not reply.is_active  # finished meanwhile: as interrupted by a sweep, say
        ):
            log.warning("Reply %s is no longer this generation's; dropping its result",
                        reply_id)
            return None
        return reply_finish(reply=reply, **fields)
