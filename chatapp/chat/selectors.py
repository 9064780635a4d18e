"""Read-only queries over conversations and messages, always scoped to a user."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from chatapp.chat.errors import NotFound
from chatapp.chat.models import Conversation, ConversationTag, HistorySummary, Message


def conversation_list(
    *, user: AbstractBaseUser, search: str = "", archived: bool | None = None, tag: str = ""
) -> QuerySet[Conversation]:
    """The user's conversations, newest first; `search` matches titles and message text.
    `archived`: True for archived ones only, False for the others; None hides them unless
    `search` is given (archived is out of the list, not out of reach). `tag`: only those
    tagged so."""
    qs = Conversation.objects.filter(owner=user)
    search = search.strip()
    if search:
        matching = Message.objects.filter(
            conversation__owner=user, content__icontains=search
        ).values("conversation_id")
        qs = qs.filter(Q(title__icontains=search) | Q(pk__in=matching))
    if archived is None and not search:
        archived = False
    if archived is not None:
        qs = qs.filter(archived=archived)
    if tag:
        qs = qs.filter(tags__name=tag)
    return qs


def sidebar_list(
    *, user: AbstractBaseUser, search: str = "", archived: bool | None = None, tag: str = ""
) -> QuerySet[Conversation]:
    """conversation_list as the chat page's sidebar shows it: pinned ones first."""
    return (conversation_list(user=user, search=search, archived=archived, tag=tag)
            .prefetch_related("tags").order_by("-pinned", "-updated_at", "-id"))


def user_tags(*, user: AbstractBaseUser) -> list[str]:
    """Every tag on the user's conversations, sorted: the sidebar's filter choices."""
    return list(ConversationTag.objects.filter(conversation__owner=user)
                .values_list("name", flat=True).distinct().order_by("name"))


def _one(qs: QuerySet, pk: int | str, what: str):
    """The row `pk` of `qs`, or NotFound (an id that is not a number included)."""
    try:
        pk = int(pk)
    except (TypeError, ValueError):
        raise NotFound(f"{what} not found.") from None
    found = qs.filter(pk=pk).first()
    if found is None:
        raise NotFound(f"{what} not found.")
    return found


def conversation_get(*, user: AbstractBaseUser, conversation_id: int | str) -> Conversation:
    """The user's conversation, or NotFound: another user's conversation looks absent."""
    if not getattr(user, "is_authenticated", False):
        raise NotFound("Conversation not found.")
    return _one(Conversation.objects.filter(owner=user), conversation_id, "Conversation")


def message_get(
    *, conversation: Conversation, message_id: int | str, role: str | None = None
) -> Message:
    qs = Message.objects.filter(conversation=conversation)
    return _one(qs.filter(role=role) if role else qs, message_id, "Message")


def message_path(*, message: Message) -> list[Message]:
    """The branch from the root down to `message`, inclusive."""
    by_id = {m.pk: m for m in Message.objects.filter(conversation_id=message.conversation_id)}
    path: list[Message] = []
    node: Message | None = by_id.get(message.pk, message)
    while node is not None:
        path.append(node)
        node = by_id.get(node.parent_id) if node.parent_id else None
    path.reverse()
    return path


def conversation_messages(*, conversation: Conversation) -> list[Message]:
    """Every message of the conversation (all branches), oldest first."""
    return list(Message.objects.filter(conversation=conversation).order_by("created_at", "id"))


def conversation_active_replies(*, conversation: Conversation) -> list[Message]:
    return list(Message.objects.filter(conversation=conversation, status__in=Message.ACTIVE))


def latest_leaf(*, conversation: Conversation) -> Message | None:
    """Where a plain "send" continues: the remembered leaf, else the newest message."""
    if conversation.current_leaf_id:
        leaf = Message.objects.filter(pk=conversation.current_leaf_id).first()
        if leaf is not None:
            return leaf
    return Message.objects.filter(conversation=conversation).order_by("-created_at", "-id").first()


def current_branch(*, conversation: Conversation) -> list[Message]:
    """The branch from the root to the latest leaf (empty for a new conversation)."""
    leaf = latest_leaf(conversation=conversation)
    return message_path(message=leaf) if leaf is not None else []


def ready_summary_ids(*, message: Message) -> list[int] | None:
    """The stored summary segment of the history cut whose last left-out message is
    `message`, once it is ready; None before then, or when it failed."""
    return (HistorySummary.objects.filter(last_left_out_id=message.pk,
                                          status=HistorySummary.Status.READY)
            .values_list("token_ids", flat=True).first())
