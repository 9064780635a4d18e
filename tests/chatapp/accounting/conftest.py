"""A limiter on the local Redis, in a database and under a prefix of its own per test."""

from __future__ import annotations

import uuid

import pytest
import redis

from chatapp.accounting import redis_limiter
from chatapp.accounting.ratelimit import active_limiter

TEST_REDIS = "redis://127.0.0.1:6379/13"


@pytest.fixture
def limiter(settings):
    client = redis.Redis.from_url(TEST_REDIS)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    prefix = f"test-limits-{uuid.uuid4().hex}"
    settings.LIMITS_REDIS_URL = TEST_REDIS
    settings.LIMITS_REDIS_PREFIX = prefix
    redis_limiter._limiters.clear()
    yield active_limiter()
    redis_limiter._limiters.clear()
    for name in client.scan_iter(f"{prefix}:*"):
        client.delete(name)
