"""Feedback on replies: a user's thumbs up or down with an optional comment (set, change,
clear), and the operators' reads of it, per model and preset."""

from __future__ import annotations

from collections.abc import Iterator

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Q

from chatapp.chat import selectors
from chatapp.chat.errors import InvalidInput, NotFound, sentence
from chatapp.chat.models import Conversation, Feedback, Message
from chatapp.prompts.encoding import check_text
from chatapp.prompts.errors import PromptError

RATINGS = {"up": Feedback.Rating.UP, "down": Feedback.Rating.DOWN}


def _rating(value: object) -> int:
    if value not in RATINGS:
        raise InvalidInput('Rating must be "up" or "down".', code="invalid_choice")
    return RATINGS[value]


def _comment(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput("Comment must be text.", code="invalid")
    value = value.strip()
    limit = Feedback.COMMENT_MAX_CHARS
    if len(value) > limit:
        raise InvalidInput(f"Comment is at most {limit} characters (this one has {len(value)}).",
                           code="max_length")
    try:
        return check_text(value, "the comment")
    except PromptError as exc:
        raise InvalidInput(sentence(str(exc)), code="invalid_value") from None


def _reply(conversation: Conversation, message_id: int | str) -> Message:
    """A finished reply of the conversation; NotFound for anything else (a user message
    included: there is nothing of the model's to judge)."""
    reply = selectors.message_get(conversation=conversation, message_id=message_id,
                                  role=Message.Role.ASSISTANT)
    if reply.is_active:
        raise InvalidInput("The reply is still being generated.", code="reply_active")
    return reply


def feedback_set(*, user: AbstractBaseUser, conversation: Conversation, message_id: int | str,
                 rating: object, comment: object = None) -> Feedback:
    """The user's feedback on a reply of their conversation, made or changed."""
    reply = _reply(conversation, message_id)
    feedback, _ = Feedback.objects.update_or_create(
        message=reply, user=user,
        defaults={"rating": _rating(rating), "comment": _comment(comment)},
    )
    return feedback


def feedback_clear(*, user: AbstractBaseUser, conversation: Conversation,
                   message_id: int | str) -> None:
    Feedback.objects.filter(message=_reply(conversation, message_id), user=user).delete()


def feedback_get(*, user: AbstractBaseUser, conversation: Conversation,
                 message_id: int | str) -> Feedback:
    found = Feedback.objects.filter(message=_reply(conversation, message_id), user=user).first()
    if found is None:
        raise NotFound("No feedback on this reply.")
    return found


def feedback_dict(feedback: Feedback) -> dict:
    return {"message_id": feedback.message_id,
            "rating": "up" if feedback.rating == Feedback.Rating.UP else "down",
            "comment": feedback.comment,
            "updated_at": feedback.updated_at.isoformat()}


def conversation_feedback(*, user: AbstractBaseUser, conversation: Conversation) -> dict:
    """message id -> the user's feedback on it, for the chat page."""
    rows = Feedback.objects.filter(user=user, message__conversation=conversation)
    return {f.message_id: feedback_dict(f) for f in rows}


def summary_by_model_and_preset() -> list[dict]:
    """Feedback counts per model and preset (the conversation's), most rated first."""
    rows = (Feedback.objects
            .values("message__conversation__model", "message__conversation__preset_id")
            .annotate(up=Count("id", filter=Q(rating=Feedback.Rating.UP)),
                      down=Count("id", filter=Q(rating=Feedback.Rating.DOWN)),
                      comments=Count("id", filter=~Q(comment="")))
            .order_by("message__conversation__model", "message__conversation__preset_id"))
    out = [{"model": r["message__conversation__model"],
            "preset": r["message__conversation__preset_id"],
            "up": r["up"], "down": r["down"], "comments": r["comments"],
            "total": r["up"] + r["down"]} for r in rows]
    return sorted(out, key=lambda r: -r["total"])


CSV_COLUMNS = ["updated_at", "rating", "comment", "model", "preset", "preset_version",
               "conversation_id", "message_id", "user"]


def csv_rows() -> Iterator[list[str]]:
    """Every feedback row for the operators' CSV export, newest first, header first."""
    yield CSV_COLUMNS
    rows = Feedback.objects.select_related("message__conversation", "user").iterator()
    for f in rows:
        conv = f.message.conversation
        yield [f.updated_at.isoformat(), "up" if f.rating == Feedback.Rating.UP else "down",
               f.comment, conv.model, conv.preset_id, conv.preset_version, str(conv.pk),
               str(f.message_id), f.user.get_username()]
