"""Usage accounting: one write per finished reply, in the database and against budgets."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from chatapp.accounting import limits
from chatapp.accounting.models import DailyUsage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplyUsage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def from_body(cls, usage: dict | None) -> ReplyUsage:
        """From an OpenAI usage object: chat and text completions' or responses' names."""
        usage = usage or {}
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens", usage.get("input_tokens")) or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens",
                                            usage.get("output_tokens")) or 0),
        )


def usage_add(*, user_id: int, key_id: int | None, model: str, usage: ReplyUsage,
              error: bool) -> None:
    """Add one reply to its day's row: an UPDATE with F() increments, or the row's INSERT
    (a concurrent insert of the same row loses and updates instead)."""
    where = {"user_id": user_id, "key_id": key_id, "model": model[:64],
             "day": timezone.now().date()}
    counts = {"requests": 1, "prompt_tokens": usage.prompt_tokens,
              "cached_tokens": usage.cached_tokens,
              "completion_tokens": usage.completion_tokens, "errors": int(error)}
    increments = {name: F(name) + n for name, n in counts.items()}
    if DailyUsage.objects.filter(**where).update(**increments):
        return
    try:
        with transaction.atomic():
            DailyUsage.objects.create(**where, **counts)
    except IntegrityError:
        DailyUsage.objects.filter(**where).update(**increments)


def reply_record(*, user, key, model: str, usage: ReplyUsage, error: bool = False) -> None:
    """A reply has finished: count it per day in the database and its weighted tokens
    against the budgets of its user and key. Accounting never fails a reply."""
    from chatapp.accounting.ratelimit import active_limiter

    try:
        usage_add(user_id=user.pk, key_id=key.pk if key is not None else None, model=model,
                  usage=usage, error=error)
    except Exception:
        log.exception("Usage of a reply by user %s not recorded", user.pk)
    tokens = limits.weighted_tokens(usage.prompt_tokens, usage.cached_tokens,
                                    usage.completion_tokens)
    active_limiter().spend(key=key, user=user, tokens=tokens)
