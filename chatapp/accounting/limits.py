"""The limits that apply to a key and to its user: their own where set, else the settings.

-1 means "no limit" below; the key's rpm and concurrency keep their meaning from
chatapp.accounting.ratelimit (0 refuses every request).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

NONE = -1


@dataclass(frozen=True)
class Limits:
    rpm: int = NONE
    concurrent: int = NONE
    tokens_per_day: int = NONE
    tokens_per_month: int = NONE


def _own(value: int | None, default: int, zero_is_none: bool) -> int:
    value = default if value is None else value
    return NONE if zero_is_none and int(value) <= 0 else int(value)


def for_key(key) -> Limits:
    return Limits(
        rpm=_own(key.rate_limit_rpm, settings.API_RATE_LIMIT_RPM, zero_is_none=False),
        concurrent=_own(key.max_concurrent, settings.API_MAX_CONCURRENT, zero_is_none=False),
        tokens_per_day=_own(None, settings.LIMITS_KEY_TOKENS_PER_DAY, zero_is_none=True),
        tokens_per_month=_own(None, settings.LIMITS_KEY_TOKENS_PER_MONTH, zero_is_none=True),
    )


def for_user(user) -> Limits:
    from chatapp.accounting.models import UserLimits

    own = UserLimits.objects.filter(user=user).first() or UserLimits()
    return Limits(
        rpm=_own(own.rpm, settings.LIMITS_USER_RPM, zero_is_none=True),
        concurrent=_own(own.concurrent, settings.LIMITS_USER_CONCURRENT, zero_is_none=True),
        tokens_per_day=_own(own.tokens_per_day, settings.LIMITS_USER_TOKENS_PER_DAY,
                            zero_is_none=True),
        tokens_per_month=_own(own.tokens_per_month, settings.LIMITS_USER_TOKENS_PER_MONTH,
                              zero_is_none=True),
    )


def weighted_tokens(prompt: int, cached: int, completion: int) -> float:
    """What a reply costs against a budget: cached prompt tokens at CHAT_CACHED_TOKEN_WEIGHT."""
    cached = min(max(cached, 0), max(prompt, 0))
    return (prompt - cached) + cached * settings.CHAT_CACHED_TOKEN_WEIGHT + completion
