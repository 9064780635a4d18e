"""Reading usage back: one user's own rows, or everyone's for an administrator."""

from __future__ import annotations

import datetime

from django.db.models import QuerySet, Sum
from django.utils import timezone

from chatapp.accounting.models import DailyUsage

COUNTS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "errors")


def usage_since(*, days: int, user=None) -> QuerySet[DailyUsage]:
    """The last `days` UTC days of usage, newest first; only `user`'s when given."""
    since = timezone.now().date() - datetime.timedelta(days=max(days, 1) - 1)
    rows = DailyUsage.objects.filter(day__gte=since).select_related("user", "key")
    return rows.filter(user=user) if user is not None else rows


def totals(rows: QuerySet[DailyUsage]) -> dict[str, int]:
    sums = rows.aggregate(**{name: Sum(name) for name in COUNTS})
    return {name: sums[name] or 0 for name in COUNTS}
