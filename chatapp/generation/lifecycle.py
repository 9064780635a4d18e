"""A reply's life in the database: claimed by a generation, kept alive by its
heartbeat, flagged to stop, marked streaming, finished (done, stopped or failed).

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

from chatapp.chat.models import Message

log = logging.getLogger(__name__)


def reply_heartbeat(*, reply_id: int, lease: str = "") -> bool:
    """Touch a running reply; False when its claim `lease` was taken over (or it is gone)."""
    replies = Message.objects.filter(pk=reply_id)
    if lease:
        replies = replies.filter(lease=lease)  # a generation that lost its claim stays silent
    return bool(replies.update(updated_at=timezone.now()))


class Claim:
    """What a worker may do with a reply it was handed (see reply_claim)."""

    CLAIMED = "claimed"    # generate it, under the returned lease
    FINISHED = "finished"  # done, stopped or failed already: nothing to do
    BUSY = "busy"          # another live generation holds it: try again later
    GONE = "gone"          # deleted with its conversation


@transaction.atomic
def reply_claim(*, reply_id: int, holder: str, reclaim_own: bool = False) -> tuple[str, str]:
    """Take reply `reply_id` for generation by `holder` (a worker); returns (Claim, lease).

    The row lock makes one of several deliveries of a task win (README, "Workers",
    Reliability). `reclaim_own`: the holder runs one task at a time, so a reply it holds
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
    cutoff = timezone.now() - timedelta(seconds=settings.CHAT_STALE_REPLY_S)
    own = reclaim_own and reply.served_by == holder
    if reply.status == Message.Status.STREAMING and reply.updated_at >= cutoff and not own:
        return Claim.BUSY, ""
    if reply.stop_requested:
        reply_finish(reply=reply, status=Message.Status.STOPPED, finish_reason="abort")
        return Claim.FINISHED, ""
    reply.lease = uuid.uuid4().hex
    reply.served_by = holder
    reply.status = Message.Status.STREAMING
    reply.save(update_fields=["lease", "served_by", "status", "updated_at"])
    return Claim.CLAIMED, reply.lease


def reply_request_stop(*, reply_id: int) -> bool:
    """Flag a reply generated elsewhere (a worker) to stop; its generation polls the flag."""
    return bool(
        Message.objects.filter(pk=reply_id, status__in=Message.ACTIVE).update(stop_requested=True)
    )


def reply_stop_requested(*, reply_id: int) -> bool:
    """True once a stop was asked for, or the reply was deleted with its conversation."""
    return not Message.objects.filter(pk=reply_id, stop_requested=False).exists()


def reply_mark_streaming(*, reply: Message, served_by: str = "") -> Message:
    reply.status = Message.Status.STREAMING
    reply.served_by = served_by or reply.served_by
    reply.save(update_fields=["status", "served_by", "updated_at"])
    return reply


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
    return reply


def reply_finish_held(*, reply_id: int, lease: str = "", **fields) -> Message | None:
    """reply_finish for a generation holding `lease`; None when another generation took
    the reply over (that one writes it, this one's result is dropped)."""
    with transaction.atomic():
        reply = Message.objects.select_for_update().get(pk=reply_id)
        if lease and reply.lease != lease:
            log.warning("Reply %s was taken over by another generation; dropping ours", reply_id)
            return None
        return reply_finish(reply=reply, **fields)
