"""Limits and token budgets in Redis, shared by every process that serves replies.

Each check-and-count is one Lua script, so two processes can never both take the
last request of a minute or the last slot. Time is Redis's own (TIME), so the
processes' clocks need not agree. Concurrency slots are members of a sorted set
scored by their expiry: this process refreshes its live slots, and a crashed
process's slots expire by themselves.

Redis down: fail open. Limits protect capacity; refusing every reply because the
limiter cannot be reached would take the service down with it. Each refused call
to Redis logs a warning.
"""

from __future__ import annotations

import calendar
import logging
import threading
import time
import uuid
import weakref

import redis
from django.conf import settings

from chatapp.accounting import limits
from chatapp.accounting.ratelimit import RateLimited

log = logging.getLogger(__name__)

ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for i = 3, 6 do
  local limit = tonumber(ARGV[i])
  if limit >= 0 and tonumber(redis.call('GET', KEYS[i]) or '0') >= limit then
    if i % 2 == 1 then return {i, ARGV[8]} end
    return {i, ARGV[9]}
  end
end
for i = 1, 2 do
  local limit = tonumber(ARGV[i])
  if limit >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - 60)
    if redis.call('ZCARD', KEYS[i]) >= limit then
      local oldest = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
      local wait = 60
      if oldest[2] then wait = tonumber(oldest[2]) + 60 - now end
      return {i, tostring(math.ceil(wait))}
    end
  end
end
for i = 1, 2 do
  if tonumber(ARGV[i]) >= 0 then
    redis.call('ZADD', KEYS[i], now, ARGV[7])
    redis.call('EXPIRE', KEYS[i], 61)
  end
end
return {0, '0'}
"""

ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[4])
for i = 1, 2 do
  local limit = tonumber(ARGV[i])
  if limit >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    if redis.call('ZCARD', KEYS[i]) >= limit then return i end
  end
end
for i = 1, 2 do
  if tonumber(ARGV[i]) >= 0 then
    redis.call('ZADD', KEYS[i], now + ttl, ARGV[3])
    redis.call('EXPIRE', KEYS[i], math.ceil(ttl) + 60)
  end
end
return 0
"""

# The scripts' KEYS order, and what to say when one of them refuses.
RPM_KEY, RPM_USER, DAY_KEY, MONTH_KEY, DAY_USER, MONTH_USER = range(1, 7)


def _refusal(which: int, lim_key: limits.Limits, lim_user: limits.Limits) -> str:
    return {
        RPM_KEY: f"Rate limit reached: {lim_key.rpm} requests per minute for this key.",
        RPM_USER: f"Rate limit reached: {lim_user.rpm} requests per minute for this user.",
        DAY_KEY: f"Token budget spent: {lim_key.tokens_per_day} tokens per day for this key.",
        MONTH_KEY: f"Token budget spent: {lim_key.tokens_per_month} tokens per month "
                   "for this key.",
        DAY_USER: f"Token budget spent: {lim_user.tokens_per_day} tokens per day "
                  "for this user.",
        MONTH_USER: f"Token budget spent: {lim_user.tokens_per_month} tokens per month "
                    "for this user.",
    }[which]


def key_id(key) -> str:
    # The creation time too: a database reset reuses ids, and old counters must not apply.
    return f"k{key.pk}.{int(key.created_at.timestamp())}"


def user_id(user) -> str:
    return f"u{user.pk}.{int(user.date_joined.timestamp())}"


def _periods(now: float) -> tuple[str, str, int, int]:
    """(day, month, seconds to the next UTC day, to the next UTC month)."""
    t = time.gmtime(now)
    to_day = 86400 - (t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec)
    days_left = calendar.monthrange(t.tm_year, t.tm_mon)[1] - t.tm_mday
    return (time.strftime("%Y%m%d", t), time.strftime("%Y%m", t), to_day,
            to_day + days_left * 86400)


class RedisSlot:
    """One running reply of a key and its user; release() is idempotent, and a slot
    dropped without release frees itself."""

    def __init__(self, limiter: RedisLimiter, names: list[str], member: str):
        self._limiter = limiter
        self.names = names
        self.member = member
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limiter._release(self)

    def __del__(self) -> None:
        self.release()


class NoSlot:
    """A slot for a reply that no concurrency limit applies to (or when Redis is down)."""

    def release(self) -> None:
        pass


class RedisLimiter:
    def __init__(self, url: str, prefix: str = "limits"):
        self.client = redis.Redis.from_url(
            url, socket_connect_timeout=settings.LIMITS_REDIS_TIMEOUT_S,
            socket_timeout=settings.LIMITS_REDIS_TIMEOUT_S)
        self.prefix = prefix
        self._admit = self.client.register_script(ADMIT)
        self._acquire = self.client.register_script(ACQUIRE)
        self._live: weakref.WeakSet[RedisSlot] = weakref.WeakSet()
        self._keeper: threading.Thread | None = None
        self._lock = threading.Lock()

    def _name(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # Requests per minute and token budgets -------------------------------------------

    def hit(self, key) -> None:
        """Count one request of `key` and its user, or raise RateLimited."""
        self._hit(key, key.user)

    def hit_user(self, user) -> None:
        """Count one request of `user` on the chat page, or raise RateLimited."""
        self._hit(None, user)

    def _hit(self, key, user) -> None:
        lim_key = limits.for_key(key) if key is not None else limits.Limits()
        lim_user = limits.for_user(user)
        kid = key_id(key) if key is not None else "none"
        uid = user_id(user)
        day, month, to_day, to_month = _periods(time.time())
        names = [self._name("rpm", kid), self._name("rpm", uid),
                 self._name("tok", day, kid), self._name("tok", month, kid),
                 self._name("tok", day, uid), self._name("tok", month, uid)]
        args = [lim_key.rpm, lim_user.rpm, lim_key.tokens_per_day, lim_key.tokens_per_month,
                lim_user.tokens_per_day, lim_user.tokens_per_month, uuid.uuid4().hex,
                to_day, to_month]
        try:
            which, wait = self._admit(keys=names, args=args)
        except redis.RedisError as exc:
            log.warning("Limits not applied: Redis unreachable (%s)", exc)
            return
        if which:
            raise RateLimited(_refusal(int(which), lim_key, lim_user), int(wait))

    def spend(self, *, key, user, tokens: float) -> None:
        """Count a finished reply's weighted tokens against its key's and user's budgets."""
        if tokens <= 0:
            return
        day, month, to_day, to_month = _periods(time.time())
        owners = [user_id(user)] + ([key_id(key)] if key is not None else [])
        try:
            with self.client.pipeline(transaction=True) as pipe:
                for owner in owners:
                    for period, ttl in ((day, to_day), (month, to_month)):
                        name = self._name("tok", period, owner)
                        pipe.incrbyfloat(name, tokens)
                        pipe.expire(name, ttl + 3600)
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("Tokens not counted against budgets: Redis unreachable (%s)", exc)

    def spent(self, owner: str) -> tuple[float, float]:
        """(tokens spent today, this month) by a key_id() or user_id()."""
        day, month, _, _ = _periods(time.time())
        values = self.client.mget([self._name("tok", day, owner),
                                   self._name("tok", month, owner)])
        return tuple(float(v or 0) for v in values)  # type: ignore[return-value]

    # Concurrency ------------------------------------------------------------------------

    def acquire(self, key) -> RedisSlot | NoSlot:
        """A slot for one reply of `key` and its user, or RateLimited."""
        return self._take(key, key.user)

    def acquire_user(self, user) -> RedisSlot | NoSlot:
        return self._take(None, user)

    def _take(self, key, user) -> RedisSlot | NoSlot:
        lim_key = limits.for_key(key) if key is not None else limits.Limits()
        lim_user = limits.for_user(user)
        if lim_key.concurrent < 0 and lim_user.concurrent < 0:
            return NoSlot()
        names = [self._name("slots", key_id(key) if key is not None else "none"),
                 self._name("slots", user_id(user))]
        member = uuid.uuid4().hex
        try:
            which = self._acquire(keys=names, args=[lim_key.concurrent, lim_user.concurrent,
                                                    member, settings.LIMITS_SLOT_TTL_S])
        except redis.RedisError as exc:
            log.warning("Concurrency not limited: Redis unreachable (%s)", exc)
            return NoSlot()
        if which == 1:
            raise RateLimited(
                f"Too many generations at once: this key may run {lim_key.concurrent}.", 1)
        if which == 2:
            raise RateLimited(
                f"Too many generations at once: this user may run {lim_user.concurrent}.", 1)
        slot = RedisSlot(self, names, member)
        with self._lock:
            self._live.add(slot)
            self._start_keeper()
        return slot

    def _release(self, slot: RedisSlot) -> None:
        with self._lock:
            self._live.discard(slot)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for name in slot.names:
                    pipe.zrem(name, slot.member)
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("Slot not released (it expires): Redis unreachable (%s)", exc)

    def refresh(self) -> None:
        """Push this process's live slots' expiry forward (a dead process stops doing so)."""
        with self._lock:
            live = list(self._live)
        if not live:
            return
        expiry = float(self.client.time()[0]) + settings.LIMITS_SLOT_TTL_S
        with self.client.pipeline(transaction=False) as pipe:
            for slot in live:
                for name in slot.names:
                    pipe.zadd(name, {slot.member: expiry}, xx=True)
            pipe.execute()

    def _start_keeper(self) -> None:
        if self._keeper is not None and self._keeper.is_alive():
            return
        self._keeper = threading.Thread(target=self._keep, name="slot-keeper", daemon=True)
        self._keeper.start()

    def _keep(self) -> None:
        while True:
            time.sleep(settings.LIMITS_SLOT_TTL_S / 3)
            try:
                self.refresh()
            except redis.RedisError as exc:
                log.warning("Slots not refreshed: Redis unreachable (%s)", exc)


_limiters: dict[str, RedisLimiter] = {}


def for_url(url: str) -> RedisLimiter:
    """One limiter (one connection pool) per Redis URL in this process."""
    if url not in _limiters:
        _limiters[url] = RedisLimiter(url, settings.LIMITS_REDIS_PREFIX)
    return _limiters[url]
