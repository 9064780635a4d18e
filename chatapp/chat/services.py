"""Writes to conversations and messages. Generation itself lives in chatapp.generation;
these functions only create, validate and record."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from chatapp.chat import selectors
from chatapp.chat.errors import Busy, InvalidInput
from chatapp.chat.models import Conversation, Message
from chatapp.generation import prompting

TITLE_CHARS = 60


def validate_user_text(content: object) -> str:
    """The user's message text, or InvalidInput with a message fit to show."""
    if not isinstance(content, str):
        raise InvalidInput("Message content must be text.")
    if not content.strip():
        raise InvalidInput("Message is empty.", code="empty_message")
    limit = settings.MAX_USER_MESSAGE_CHARS
    if len(content) > limit:
        raise InvalidInput(
            f"Message is too long ({len(content)} characters; the limit is {limit}).",
            code="message_too_long",
        )
    return content


def conversation_create(
    *,
    owner: AbstractBaseUser,
    preset_id: str | None = None,
    preset_version: str | None = None,
    variables: dict | None = None,
    title: str = "",
) -> Conversation:
    try:
        preset = prompting.resolve_preset(preset_id, preset_version)
    except prompting.PromptFailure as exc:
        raise InvalidInput(str(exc), code="unknown_preset") from exc
    return Conversation.objects.create(
        owner=owner,
        title=title.strip()[:200],
        preset_id=preset.id,
        preset_version=preset.version,
        preset_variables=variables or {},
    )


def conversation_rename(*, conversation: Conversation, title: object) -> Conversation:
    if not isinstance(title, str) or not title.strip():
        raise InvalidInput("Title is empty.")
    conversation.title = title.strip()[:200]
    conversation.save(update_fields=["title", "updated_at"])
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    conversation.delete()


INTERRUPTED = "The server stopped while this reply was being generated; regenerate it."


def replies_recover_stale(*, conversation: Conversation) -> list[Message]:
    """Mark as failed the replies a dead process left pending or streaming.

    A running generation touches its reply every CHAT_HEARTBEAT_S seconds, so one
    untouched for CHAT_STALE_REPLY_S has no process behind it any more; without this
    a restart mid-reply would leave the conversation busy for ever.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.CHAT_STALE_REPLY_S)
    stale = [
        reply for reply in selectors.conversation_active_replies(conversation=conversation)
        if reply.updated_at < cutoff
    ]
    for reply in stale:
        reply_finish(reply=reply, status=Message.Status.ERROR, content=reply.content,
                     finish_reason="error", error=INTERRUPTED)
    return stale


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

    A task can be delivered more than once (a redelivery after a worker vanished, or a
    duplicate): the row lock makes exactly one delivery win. A reply still streaming is
    held by a live generation while its heartbeat is fresh; once the heartbeat is older
    than CHAT_STALE_REPLY_S its generation is taken to be dead and is replaced.
    `reclaim_own`: the holder runs one task at a time, so if it holds the reply already,
    that generation died with its process (a killed pool child): replace it at once.
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
    active = (Message.Status.PENDING, Message.Status.STREAMING)
    return bool(
        Message.objects.filter(pk=reply_id, status__in=active).update(stop_requested=True)
    )


def reply_stop_requested(*, reply_id: int) -> bool:
    """True once a stop was asked for, or the reply was deleted with its conversation."""
    return not Message.objects.filter(pk=reply_id, stop_requested=False).exists()


def _ensure_idle(conversation: Conversation) -> None:
    replies_recover_stale(conversation=conversation)
    if selectors.conversation_active_replies(conversation=conversation):
        raise Busy("A reply is still being generated; stop it or wait for it to finish.")


def _usable_parent(parent: Message | None) -> Message | None:
    """Where a new turn attaches. After a failed reply the new message goes beside the
    turn that failed (a new branch; the failed one stays), since a prompt cannot
    include a reply that has no tokens."""
    if parent is None:
        return None
    if parent.role != Message.Role.ASSISTANT:
        raise InvalidInput("A new message must follow a reply.")
    if parent.status == Message.Status.ERROR:
        failed_turn = parent.parent
        return failed_turn.parent if failed_turn is not None else None
    if parent.status not in (Message.Status.DONE, Message.Status.STOPPED):
        raise Busy("A reply is still being generated; stop it or wait for it to finish.")
    return parent


def _auto_title(conversation: Conversation, content: str) -> None:
    if not conversation.title:
        line = " ".join(content.split())
        conversation.title = line[:TITLE_CHARS] + ("…" if len(line) > TITLE_CHARS else "")


def _add_turn(conversation: Conversation, parent: Message | None, content: str):
    user_msg = Message.objects.create(
        conversation=conversation, parent=parent, role=Message.Role.USER, content=content
    )
    reply = Message.objects.create(
        conversation=conversation,
        parent=user_msg,
        role=Message.Role.ASSISTANT,
        status=Message.Status.PENDING,
    )
    _auto_title(conversation, content)
    conversation.current_leaf = reply
    conversation.save(update_fields=["title", "current_leaf", "updated_at"])
    return user_msg, reply


@transaction.atomic
def message_send(
    *, conversation: Conversation, content: object, parent_id: int | str | None = None
) -> tuple[Message, Message]:
    """Add a user message after `parent_id` (default: the current leaf) and a pending reply."""
    content = validate_user_text(content)
    _ensure_idle(conversation)
    if parent_id is None:
        parent = selectors.latest_leaf(conversation=conversation)
    else:
        parent = selectors.message_get(conversation=conversation, message_id=parent_id)
    return _add_turn(conversation, _usable_parent(parent), content)


@transaction.atomic
def message_edit(
    *, conversation: Conversation, message_id: int | str, content: object
) -> tuple[Message, Message]:
    """A new user message beside `message_id` (a sibling: a new branch) and a pending reply.
    The original message and everything under it stay as they were."""
    content = validate_user_text(content)
    _ensure_idle(conversation)
    original = selectors.message_get(
        conversation=conversation, message_id=message_id, role=Message.Role.USER
    )
    return _add_turn(conversation, original.parent, content)


@transaction.atomic
def message_regenerate(*, conversation: Conversation, message_id: int | str) -> Message:
    """A new pending reply beside the reply `message_id`, to the same user message."""
    _ensure_idle(conversation)
    original = selectors.message_get(
        conversation=conversation, message_id=message_id, role=Message.Role.ASSISTANT
    )
    reply = Message.objects.create(
        conversation=conversation,
        parent_id=original.parent_id,
        role=Message.Role.ASSISTANT,
        status=Message.Status.PENDING,
    )
    conversation.current_leaf = reply
    conversation.save(update_fields=["current_leaf", "updated_at"])
    return reply


def conversation_select_leaf(*, conversation: Conversation, message_id: int | str) -> Message:
    """Remember which branch the owner is looking at, so a plain send continues there."""
    leaf = selectors.message_get(conversation=conversation, message_id=message_id)
    conversation.current_leaf = leaf
    conversation.save(update_fields=["current_leaf"])
    return leaf


def reply_mark_streaming(*, reply: Message, served_by: str = "") -> Message:
    reply.status = Message.Status.STREAMING
    reply.served_by = served_by or reply.served_by
    reply.save(update_fields=["status", "served_by", "updated_at"])
    return reply


def user_message_store_segment(*, message: Message, token_ids: list[int]) -> None:
    """Keep the ids a user message contributed, once: later prompts reuse them verbatim."""
    if not message.token_ids:
        message.token_ids = list(token_ids)
        message.save(update_fields=["token_ids", "updated_at"])


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
    reply.save()
    return reply
