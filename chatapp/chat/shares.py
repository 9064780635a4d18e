"""Read-only links to one branch of a conversation: made by its owner (a snapshot of the
branch), listed, revoked; opened by anyone with the link (chatapp.web.shares)."""

from __future__ import annotations

import secrets

from django.db.models import QuerySet
from django.utils import timezone

from chatapp.chat import selectors
from chatapp.chat.errors import InvalidInput, NotFound
from chatapp.chat.models import Conversation, ConversationShare, Message

# 32 random bytes: the link is its own key, so it must not be guessable.
TOKEN_BYTES = 32


def share_create(*, conversation: Conversation, message_id: int | str | None = None,
                 show_owner: bool = False) -> ConversationShare:
    """Share the branch from the root to `message_id` (default: the branch the owner is
    on), as it is now. A reply still being generated is left out."""
    if message_id is None:
        leaf = selectors.latest_leaf(conversation=conversation)
    else:
        leaf = selectors.message_get(conversation=conversation, message_id=message_id)
    branch = [] if leaf is None else selectors.message_path(message=leaf)
    kept = [m for m in branch if not m.is_active and m.status != Message.Status.ERROR]
    if not kept:
        raise InvalidInput("There is nothing to share yet: the conversation has no finished "
                           "messages.", code="empty_conversation")
    return ConversationShare.objects.create(
        conversation=conversation,
        token=secrets.token_urlsafe(TOKEN_BYTES),
        title=conversation.title,
        leaf=leaf,
        show_owner=bool(show_owner),
        messages=[{"role": m.role, "content": m.content,
                   "created_at": m.created_at.isoformat()} for m in kept],
    )


def share_list(*, conversation: Conversation) -> QuerySet[ConversationShare]:
    """The conversation's links that still work, newest first."""
    return conversation.shares.filter(revoked_at__isnull=True)


def share_revoke(*, conversation: Conversation, share_id: int | str) -> None:
    """End a link of the conversation now; its page answers 404 from then on."""
    share = _one_of(conversation, share_id)
    share.revoked_at = timezone.now()
    share.save(update_fields=["revoked_at"])


def _one_of(conversation: Conversation, share_id: int | str) -> ConversationShare:
    try:
        pk = int(share_id)
    except (TypeError, ValueError):
        raise NotFound("Share not found.") from None
    share = share_list(conversation=conversation).filter(pk=pk).first()
    if share is None:
        raise NotFound("Share not found.")
    return share


def shared_get(*, token: str) -> ConversationShare:
    """The live share behind a link, or NotFound (revoked, deleted or never made)."""
    share = (ConversationShare.objects.select_related("conversation__owner")
             .filter(token=token or "", revoked_at__isnull=True).first())
    if share is None:
        raise NotFound("This shared conversation does not exist or is no longer shared.")
    return share
