"""What the titles the model writes cost (CHAT_TITLES), for the dashboard: each is a
continuation of its conversation's cached prompt, so its prompt is mostly cached and
it costs about its own tokens."""

from __future__ import annotations

from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce

from chatapp.chat.models import GeneratedTitle


def title_costs() -> dict:
    """Titles by outcome and their tokens: prompt, cached, computed (prompt less cached),
    written, and per title on average the tokens computed and written."""
    Status = GeneratedTitle.Status
    figures = GeneratedTitle.objects.aggregate(
        asked=Count("id"),
        ready=Count("id", filter=Q(status=Status.READY)),
        dropped=Count("id", filter=Q(status=Status.DROPPED)),
        failed=Count("id", filter=Q(status=Status.FAILED)),
        generated=Count("id", filter=Q(prompt_tokens__isnull=False)),
        prompt_tokens=Coalesce(Sum("prompt_tokens"), 0),
        cached_tokens=Coalesce(Sum("cached_tokens"), 0),
        completion_tokens=Coalesce(Sum("completion_tokens"), 0),
    )
    computed = figures["prompt_tokens"] - figures["cached_tokens"]
    generated = figures["generated"]
    return {**figures, "computed_tokens": computed,
            "computed_per_title": round(computed / generated, 1) if generated else None,
            "completion_per_title": (round(figures["completion_tokens"] / generated, 1)
                                     if generated else None)}
