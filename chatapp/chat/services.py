"""Writes to conversations and messages: create, validate, record. A reply's life while
it is generated (claim, heartbeat, stop, finish) is chatapp.generation's."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from chatapp.chat import selectors
from chatapp.chat.errors import Busy, InvalidInput, sentence
from chatapp.chat.models import Conversation, ConversationTag, GeneratedTitle, Message
from chatapp.prompts import catalog
from chatapp.prompts.encoding import check_text
from chatapp.prompts.errors import EmptyMessage, MessageTooLong, PromptError
from chatapp.prompts.services import check_user_text

TITLE_CHARS = 60


def validate_user_text(content: object) -> str:
    """The user's message text, or InvalidInput with a message fit to show (the rules are
    the prompt manager's: chatapp.prompts.services.check_user_text)."""
    try:
        return check_user_text(content, settings.MAX_USER_MESSAGE_CHARS)
    except PromptError as exc:
        code = _TEXT_CODES.get(type(exc), "invalid_value")
        raise InvalidInput(sentence(str(exc)), code=code) from None


_TEXT_CODES = {EmptyMessage: "empty_message", MessageTooLong: "message_too_long"}


def validate_title(title: object, *, allow_blank: bool = False) -> str:
    """A conversation's title, stripped, or InvalidInput with a message fit to show: text,
    at most Conversation.TITLE_MAX_CHARS characters, no NUL or lone surrogate, not blank
    unless `allow_blank`. The rule's one owner: the chat page and the conversations API
    both defer to it."""
    if not isinstance(title, str | None):
        raise InvalidInput("Title must be text.", code="invalid")
    title = (title or "").strip()
    if not title and not allow_blank:
        raise InvalidInput("Title is empty.", code="blank")
    limit = Conversation.TITLE_MAX_CHARS
    if len(title) > limit:
        raise InvalidInput(f"Title is at most {limit} characters (this one has {len(title)}).",
                           code="max_length")
    try:
        return check_text(title, "the title")
    except PromptError as exc:
        raise InvalidInput(sentence(str(exc)), code="invalid_value") from None


def _check_variables(variables: dict | None) -> dict:
    """Preset variables end up in the prompt: the same text rules as a message."""
    for name, value in (variables or {}).items():
        if isinstance(value, str):
            try:
                check_text(value, f"variable {name!r}")
            except PromptError as exc:
                raise InvalidInput(sentence(str(exc)), code="invalid_value") from None
    return variables or {}


def conversation_create(
    *,
    owner: AbstractBaseUser,
    preset_id: str | None = None,
    preset_version: str | None = None,
    variables: dict | None = None,
    title: str = "",
    model: str = "",
) -> Conversation:
    """A new conversation with a preset and a model: the value the model catalog gave
    (chatapp.generation.served_models.conversation_value; blank: the default)."""
    try:
        preset = catalog.resolve_preset(preset_id, preset_version)
    except catalog.UnknownPreset as exc:
        raise InvalidInput(str(exc), code="unknown_preset") from exc
    return Conversation.objects.create(
        owner=owner,
        title=validate_title(title, allow_blank=True),
        preset_id=preset.id,
        preset_version=preset.version,
        preset_variables=_check_variables(variables),
        model=model,
    )


def conversation_rename(*, conversation: Conversation, title: object) -> Conversation:
    conversation.title = validate_title(title)
    conversation.save(update_fields=["title", "updated_at"])
    # A user's rename wins over a title the model has yet to write.
    GeneratedTitle.objects.filter(
        conversation=conversation,
        status__in=(GeneratedTitle.Status.PENDING, GeneratedTitle.Status.RUNNING),
    ).update(status=GeneratedTitle.Status.DROPPED)
    return conversation


MAX_TAGS = 10


def validate_tags(tags: object) -> list[str]:
    """A conversation's tags: a list of short labels, stripped, inner spaces collapsed,
    duplicates dropped; InvalidInput with a message fit to show otherwise."""
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise InvalidInput("Tags must be a list of text labels.", code="invalid")
    names: list[str] = []
    for tag in tags:
        name = " ".join(tag.split())
        if not name:
            raise InvalidInput("A tag is empty.", code="blank")
        limit = ConversationTag.NAME_MAX_CHARS
        if len(name) > limit:
            raise InvalidInput(f"A tag is at most {limit} characters ({name[:limit]}… is longer).",
                               code="max_length")
        try:
            check_text(name, "a tag")
        except PromptError as exc:
            raise InvalidInput(sentence(str(exc)), code="invalid_value") from None
        if name not in names:
            names.append(name)
    if len(names) > MAX_TAGS:
        raise InvalidInput(f"At most {MAX_TAGS} tags a conversation.", code="max_length")
    return names


@transaction.atomic
def conversation_organise(
    *, conversation: Conversation, pinned: bool | None = None, archived: bool | None = None,
    tags: object = None,
) -> Conversation:
    """Pin, archive (or restore) and tag a conversation; None leaves that as it is. Its
    updated_at stays: organising is not activity, and the list keeps its order."""
    fields = []
    if pinned is not None:
        conversation.pinned = bool(pinned)
        fields.append("pinned")
    if archived is not None:
        conversation.archived = bool(archived)
        fields.append("archived")
    if fields:
        conversation.save(update_fields=fields)
    if tags is not None:
        names = validate_tags(tags)
        conversation.tags.exclude(name__in=names).delete()
        have = set(conversation.tags.values_list("name", flat=True))
        ConversationTag.objects.bulk_create(
            [ConversationTag(conversation=conversation, name=n) for n in names if n not in have])
    return conversation


def replies_interrupt(*, replies) -> list[int]:
    """Finish the active replies of `replies` (a queryset) as interrupted: their process
    died. The text, ids and usage their generation persisted stay; returns their ids."""
    now = timezone.now()
    ids = []
    for pk in replies.filter(status__in=Message.ACTIVE).values_list("pk", flat=True):
        # One row at a time, the status filter again: a reply finished meanwhile by its
        # (live) generation wins, and is not counted (nor announced) as interrupted.
        if Message.objects.filter(pk=pk, status__in=Message.ACTIVE).update(
                status=Message.Status.INTERRUPTED, finish_reason="interrupted", updated_at=now):
            ids.append(pk)
    return ids


def stale_replies(*, conversation: Conversation | None = None):
    """Active replies no live process can be behind: a running generation persists its
    reply every CHAT_HEARTBEAT_S, so one claimed but untouched for CHAT_ORPHAN_S has lost
    its process; one never claimed (queued for a worker) gets CHAT_STALE_REPLY_S."""
    now = timezone.now()
    replies = Message.objects.filter(status__in=Message.ACTIVE)
    if conversation is not None:
        replies = replies.filter(conversation=conversation)
    claimed = Q(runner__gt="", updated_at__lt=now - timedelta(seconds=settings.CHAT_ORPHAN_S))
    queued = Q(runner="", updated_at__lt=now - timedelta(seconds=settings.CHAT_STALE_REPLY_S))
    return replies.filter(claimed | queued)


def replies_recover_stale(*, conversation: Conversation) -> list[int]:
    """Interrupt the conversation's stale replies (see stale_replies); returns their ids.
    Without this a restart mid-reply would leave the conversation busy."""
    return replies_interrupt(replies=stale_replies(conversation=conversation))


def _ensure_idle(conversation: Conversation) -> None:
    replies_recover_stale(conversation=conversation)
    if selectors.conversation_active_replies(conversation=conversation):
        raise Busy("A reply is still being generated; stop it or wait for it to finish.")


def _usable_parent(parent: Message | None) -> Message | None:
    """Where a new turn attaches. After a failed reply (or one interrupted before it had
    any ids) the new message goes beside the turn that failed (a new branch; the failed
    one stays), since a prompt cannot include a reply that has no tokens."""
    if parent is None:
        return None
    if parent.role != Message.Role.ASSISTANT:
        raise InvalidInput("A new message must follow a reply.")
    if parent.status == Message.Status.ERROR or (
        parent.status == Message.Status.INTERRUPTED and not parent.token_ids
    ):
        failed_turn = parent.parent
        return failed_turn.parent if failed_turn is not None else None
    if parent.status not in (Message.Status.DONE, Message.Status.STOPPED,
                             Message.Status.INTERRUPTED):
        raise Busy("A reply is still being generated; stop it or wait for it to finish.")
    return parent


def auto_title(content: str) -> str:
    """The title a conversation takes from its first message until it has a better one."""
    line = " ".join(content.split())
    return line[:TITLE_CHARS] + ("…" if len(line) > TITLE_CHARS else "")


def _auto_title(conversation: Conversation, content: str) -> None:
    if not conversation.title:
        conversation.title = auto_title(content)


def _pending_reply(conversation: Conversation, parent_id: int) -> Message:
    """A pending reply to `parent_id`, which becomes the current leaf (saved by the caller)."""
    reply = Message.objects.create(conversation=conversation, parent_id=parent_id,
                                   role=Message.Role.ASSISTANT, status=Message.Status.PENDING,
                                   model=conversation.model)
    conversation.current_leaf = reply
    return reply


def _add_turn(conversation: Conversation, parent: Message | None, content: str):
    user_msg = Message.objects.create(
        conversation=conversation, parent=parent, role=Message.Role.USER, content=content,
        model=conversation.model,
    )
    reply = _pending_reply(conversation, user_msg.pk)
    _auto_title(conversation, content)
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
    reply = _pending_reply(conversation, original.parent_id)
    conversation.save(update_fields=["current_leaf", "updated_at"])
    return reply


@transaction.atomic
def message_continue(*, conversation: Conversation, message_id: int | str) -> Message:
    """Put the cut-short reply `message_id` back to pending, to generate more of it after
    the ids it holds (its prompt then is its previous one plus those ids: cached)."""
    _ensure_idle(conversation)
    reply = selectors.message_get(
        conversation=conversation, message_id=message_id, role=Message.Role.ASSISTANT
    )
    if not reply.can_continue:
        raise InvalidInput("Only a reply that was interrupted, stopped or cut at its length "
                           "limit can be continued.", code="not_continuable")
    if reply.children.exists():
        raise InvalidInput("Only the last reply of a branch can be continued.",
                           code="not_continuable")
    if reply.model != conversation.model:
        # Its ids are another tokenizer's: the new model cannot go on from them.
        raise InvalidInput("This reply was written by the chat's previous model; "
                           "regenerate it instead.", code="not_continuable")
    reply.status = Message.Status.PENDING
    reply.finish_reason = ""
    reply.runner = ""
    reply.lease = ""
    reply.stop_requested = False
    reply.save(update_fields=["status", "finish_reason", "runner", "lease", "stop_requested",
                              "updated_at"])
    conversation.current_leaf = reply
    conversation.save(update_fields=["current_leaf", "updated_at"])
    return reply


def conversation_select_leaf(*, conversation: Conversation, message_id: int | str) -> Message:
    """Remember which branch the owner is looking at, so a plain send continues there."""
    leaf = selectors.message_get(conversation=conversation, message_id=message_id)
    conversation.current_leaf = leaf
    conversation.save(update_fields=["current_leaf"])
    return leaf


def user_message_store_segment(*, message: Message, token_ids: list[int]) -> None:
    """Keep the ids a user message contributed, once: later prompts reuse them verbatim."""
    if not message.token_ids:
        message.token_ids = list(token_ids)
        message.save(update_fields=["token_ids", "updated_at"])




def message_store_segment(*, message: Message, token_ids: list[int]) -> None:
    """Keep the ids a message without any (an imported one) was encoded to, once, unless
    another process stored them first: later prompts reuse them verbatim."""
    if message.token_ids:
        return
    message.token_ids = list(token_ids)
    Message.objects.filter(pk=message.pk, token_ids=[]).update(token_ids=message.token_ids)
