"""Importing another chat service's export file as the user's own conversations.

The file is read whole (chatapp.chat.import_formats) and checked against
CHAT_IMPORT_MAX_BYTES and CHAT_IMPORT_MAX_MESSAGES before anything is stored; then every
conversation is stored in one transaction, so a refused file leaves nothing behind.
Imported messages have no token ids: the first prompt that needs them encodes them once
with the conversation's model and stores them (chatapp.generation.prompting).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from chatapp.chat import services
from chatapp.chat.errors import InvalidInput
from chatapp.chat.import_formats import ImportedConversation, ImportRefused, read_export
from chatapp.chat.models import Conversation, Message
from chatapp.prompts.encoding import check_text
from chatapp.prompts.errors import PromptError
from chatapp.prompts.services import check_user_text

UNTITLED = "Imported conversation"


def parse_export(data: object) -> list[ImportedConversation]:
    """The conversations of an export file's decoded JSON; InvalidInput (code
    import_refused or import_too_large) naming what could not be read."""
    try:
        conversations = read_export(data)
    except ImportRefused as exc:
        raise InvalidInput(str(exc), code="import_refused") from None
    count = sum(len(c.messages) for c in conversations)
    if count > settings.CHAT_IMPORT_MAX_MESSAGES:
        raise InvalidInput(f"The file holds {count} messages; at most "
                           f"{settings.CHAT_IMPORT_MAX_MESSAGES} can be imported at once.",
                           code="import_too_large")
    for n, imported in enumerate(conversations, start=1):
        _check_texts(imported, n)
    return conversations


def _check_texts(imported: ImportedConversation, n: int) -> None:
    """Every message obeys the rules a message typed on the page does, so the prompt
    built from it later cannot fail on it."""
    for m in imported.messages:
        try:
            if m.role == Message.Role.USER:
                check_user_text(m.content, settings.MAX_USER_MESSAGE_CHARS)
            else:
                check_text(m.content, "the message")
        except PromptError as exc:
            named = f" (\"{imported.title[:60]}\")" if imported.title else ""
            raise InvalidInput(f"In conversation {n}{named}, message {m.key}: {exc}.",
                               code="import_refused") from None


def check_upload_size(size: int) -> None:
    """InvalidInput for an upload larger than CHAT_IMPORT_MAX_BYTES, before it is read."""
    if size > settings.CHAT_IMPORT_MAX_BYTES:
        raise InvalidInput(f"The file is {size} bytes; at most "
                           f"{settings.CHAT_IMPORT_MAX_BYTES} can be imported.",
                           code="import_too_large")


@transaction.atomic
def conversations_import(*, owner: AbstractBaseUser, conversations: list[ImportedConversation],
                         model: str = "") -> list[Conversation]:
    """Store `conversations` as `owner`'s, on the default preset and `model` (the value
    the model catalog gave), each with its current leaf where the source had it."""
    stored = []
    for imported in conversations:
        title = imported.title or services.auto_title(imported.messages[0].content) or UNTITLED
        conversation = services.conversation_create(
            owner=owner, title=title[:Conversation.TITLE_MAX_CHARS], model=model)
        ids: dict[str, Message] = {}
        for m in imported.messages:
            ids[m.key] = Message.objects.create(
                conversation=conversation, parent=ids.get(m.parent) if m.parent else None,
                role=m.role, content=m.content, status=Message.Status.DONE,
                model=conversation.model)
        conversation.current_leaf = ids[imported.current]
        conversation.save(update_fields=["current_leaf", "updated_at"])
        stored.append(conversation)
    return stored
