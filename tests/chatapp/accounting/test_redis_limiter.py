"""The Redis limiter in this process: per key and per user, token budgets, slots that a
dead process leaves expire, and what happens when Redis cannot be reached."""

from __future__ import annotations

import logging
import time

import pytest

from chatapp.accounting import redis_limiter
from chatapp.accounting.models import UserLimits
from chatapp.accounting.ratelimit import RateLimited, active_limiter
from chatapp.accounting.services import ReplyUsage, reply_record
from chatapp.api import services
from chatapp.api.models import ApiKey

pytestmark = pytest.mark.django_db


def _key(user, **limits) -> ApiKey:
    key, _ = services.api_key_create(user=user, name="t", **limits)
    return key


def test_requests_per_minute_per_key(limiter, alice):
    key = _key(alice, rate_limit_rpm=3)
    for _ in range(3):
        limiter.hit(key)
    with pytest.raises(RateLimited) as refused:
        limiter.hit(key)
    assert "3 requests per minute for this key" in refused.value.message
    assert 1 <= refused.value.retry_after <= 60
    limiter.hit(_key(alice, rate_limit_rpm=3))  # another key of hers has its own count


def test_requests_per_minute_per_user_across_her_keys(limiter, alice, bob):
    UserLimits.objects.create(user=alice, rpm=2)
    limiter.hit(_key(alice))
    limiter.hit(_key(alice))
    with pytest.raises(RateLimited) as refused:
        limiter.hit(_key(alice))
    assert "for this user" in refused.value.message
    limiter.hit_user(bob)  # others are not affected


def test_concurrency_per_key_and_per_user(limiter, alice, settings):
    key = _key(alice, max_concurrent=1)
    slot = limiter.acquire(key)
    with pytest.raises(RateLimited) as refused:
        limiter.acquire(key)
    assert refused.value.retry_after == 1
    slot.release()
    slot.release()  # idempotent
    limiter.acquire(key).release()

    UserLimits.objects.create(user=alice, concurrent=1)
    held = limiter.acquire(_key(alice))
    with pytest.raises(RateLimited, match="this user may run 1"):
        limiter.acquire_user(alice)
    held.release()
    limiter.acquire_user(alice).release()


def test_a_dead_process_slot_expires(limiter, alice, settings):
    settings.LIMITS_SLOT_TTL_S = 1
    key = _key(alice, max_concurrent=1)
    slot = limiter.acquire(key)
    # A process that dies neither releases nor refreshes its slots.
    slot._released = True
    limiter._live.discard(slot)
    with pytest.raises(RateLimited):
        limiter.acquire(key)
    for _ in range(100):
        try:
            limiter.acquire(key).release()
            break
        except RateLimited:
            time.sleep(0.1)
    else:
        pytest.fail("the dead slot never expired")


def test_a_live_slot_is_kept_while_its_reply_runs(limiter, alice, settings):
    settings.LIMITS_SLOT_TTL_S = 1
    key = _key(alice, max_concurrent=1)
    slot = limiter.acquire(key)
    for _ in range(15):
        limiter.refresh()  # what the keeper thread does every third of the TTL
        with pytest.raises(RateLimited):
            limiter.acquire(key)
        time.sleep(0.2)
    slot.release()
    limiter.acquire(key).release()


def test_token_budget_per_user_refuses_once_spent(limiter, alice, settings):
    settings.CHAT_CACHED_TOKEN_WEIGHT = 0.25
    UserLimits.objects.create(user=alice, tokens_per_day=30)
    key = _key(alice)
    limiter.hit(key)
    # 40 cached prompt tokens cost 10; 4 uncached and 6 generated cost 10 more.
    reply_record(user=alice, key=key, model="m",
                 usage=ReplyUsage(prompt_tokens=44, cached_tokens=40, completion_tokens=6))
    assert limiter.spent(redis_limiter.user_id(alice)) == (20.0, 20.0)
    assert limiter.spent(redis_limiter.key_id(key)) == (20.0, 20.0)
    limiter.hit(key)  # 20 of 30: still allowed
    reply_record(user=alice, key=None, model="m",
                 usage=ReplyUsage(prompt_tokens=5, completion_tokens=5))
    with pytest.raises(RateLimited) as refused:
        limiter.hit(key)
    assert "30 tokens per day for this user" in refused.value.message
    assert 1 <= refused.value.retry_after <= 86400
    with pytest.raises(RateLimited):
        limiter.hit_user(alice)  # the chat page too


def test_token_budget_per_key_from_settings(limiter, alice, settings):
    settings.LIMITS_KEY_TOKENS_PER_MONTH = 10
    key, other = _key(alice), _key(alice)
    reply_record(user=alice, key=key, model="m",
                 usage=ReplyUsage(prompt_tokens=8, completion_tokens=2))
    with pytest.raises(RateLimited, match="10 tokens per month for this key"):
        limiter.hit(key)
    limiter.hit(other)


def test_redis_down_fails_open_with_a_warning(alice, settings, caplog):
    # Nothing listens on port 1: every call to Redis is refused.
    settings.LIMITS_REDIS_URL = "redis://127.0.0.1:1/0"
    redis_limiter._limiters.clear()
    try:
        limiter = active_limiter()
        key = _key(alice, rate_limit_rpm=1, max_concurrent=1)
        with caplog.at_level(logging.WARNING, logger="chatapp.accounting.redis_limiter"):
            for _ in range(3):
                limiter.hit(key)
                limiter.acquire(key).release()
            reply_record(user=alice, key=key, model="m",
                         usage=ReplyUsage(prompt_tokens=3, completion_tokens=1))
        assert "Redis unreachable" in caplog.text
    finally:
        redis_limiter._limiters.clear()
