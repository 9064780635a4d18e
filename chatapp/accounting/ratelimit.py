"""Per-key rate limits: requests per minute (sliding window) and generations at once.

Without Redis the counters live in this process, like the embedded engine whose
capacity they protect; with several server processes each one applies the limits on
its own. With REDIS_URL set, active_limiter() is chatapp.accounting.redis_limiter's,
shared by every process, with per-user limits and token budgets besides.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque

from django.conf import settings

WINDOW_S = 60.0


class RateLimited(Exception):
    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.message = message
        self.retry_after = max(1, int(retry_after))


def _limit(own: int | None, default: int) -> int:
    """A key's own limit where it has one, else the setting."""
    return int(own if own is not None else default)


class Slot:
    """One running generation of a key; release() is idempotent, and a slot dropped
    without release (a response that never started streaming) frees itself."""

    def __init__(self, limiter: RateLimiter, key_id: int):
        self._limiter = limiter
        self._key_id = key_id
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limiter._release(self._key_id)

    def __del__(self) -> None:
        self.release()


class RateLimiter:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._hits: dict[int, deque[float]] = defaultdict(deque)
        self._running: dict[int, int] = defaultdict(int)

    def hit(self, key) -> None:
        """Count one request of `key`, or raise RateLimited (the request is not counted)."""
        limit = _limit(key.rate_limit_rpm, settings.API_RATE_LIMIT_RPM)
        now = self._clock()
        with self._lock:
            hits = self._hits[key.pk]
            while hits and hits[0] <= now - WINDOW_S:
                hits.popleft()
            if limit <= 0 or len(hits) >= limit:
                wait = (hits[0] + WINDOW_S - now) if hits else WINDOW_S
                raise RateLimited(
                    f"Rate limit reached: {limit} requests per minute for this key.",
                    math.ceil(wait),
                )
            hits.append(now)

    def acquire(self, key) -> Slot:
        """A generation slot of `key`, or RateLimited when it has its maximum running."""
        limit = _limit(key.max_concurrent, settings.API_MAX_CONCURRENT)
        with self._lock:
            if self._running[key.pk] >= limit:
                raise RateLimited(
                    f"Too many generations at once: this key may run {limit}.", retry_after=1
                )
            self._running[key.pk] += 1
        return Slot(self, key.pk)

    def hit_user(self, user) -> None:
        """The chat page is not limited without Redis."""

    def acquire_user(self, user) -> None:
        return None

    def spend(self, *, key, user, tokens: float) -> None:
        """Token budgets need Redis: nothing to count here."""

    def _release(self, key_id: int) -> None:
        with self._lock:
            self._running[key_id] = max(0, self._running[key_id] - 1)

    def reset(self) -> None:
        with self._lock:
            self._hits.clear()
            self._running.clear()


limiter = RateLimiter()


def active_limiter():
    """The Redis limiter when REDIS_URL (or LIMITS_REDIS_URL) is set, else this process's."""
    url = getattr(settings, "LIMITS_REDIS_URL", "")
    if not url:
        return limiter
    from chatapp.accounting import redis_limiter

    return redis_limiter.for_url(url)
