"""Which workers are alive and how loaded they are, kept in the Redis broker (one hash
per shared queue, so installations sharing a Redis never see each other's workers).

A worker that missed MISSED_BEATS beats is gone, and the live ones move the tasks left
in its own queue to the shared queue: the broker hands a task back to the queue it came
from, so one waiting for a dead worker would wait for ever. Only a Redis broker has this
view; with another every task goes to the shared queue.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

from django.conf import settings

log = logging.getLogger(__name__)

# kombu's Redis transport keeps a queue's prioritised messages in extra lists named
# queue + separator + priority (steps 3, 6, 9); plain messages are in the queue's own list.
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = (3, 6, 9)
MISSED_BEATS = 3

_client = None
_client_key: tuple | None = None


@dataclass(frozen=True)
class WorkerState:
    name: str
    queue: str
    active: int
    seen: float  # unix time of the last beat
    models: tuple[str, ...] | None = None  # the aliases it hosts (None: not advertised)


def own_queue(worker_name: str) -> str:
    """The queue only worker `worker_name` consumes."""
    return f"{settings.CELERY_SHARED_QUEUE}.{worker_name}"


def _registry_key() -> str:
    return f"prefixchat:workers:{settings.CELERY_SHARED_QUEUE}"


def available() -> bool:
    return str(settings.CELERY_BROKER_URL).startswith(("redis://", "rediss://", "unix://"))


def client():
    """A Redis client on the broker, one per process (a forked worker child makes its own)."""
    global _client, _client_key
    key = (os.getpid(), settings.CELERY_BROKER_URL)
    if _client is None or _client_key != key:
        import redis

        _client = redis.Redis.from_url(
            settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2
        )
        _client_key = key
    return _client


def beat(worker_name: str, *, active: int, ready: bool = True,
         models: list[str] | None = None) -> None:
    """Record the worker as alive, with the models it hosts (the router sends it only
    turns of those); `ready` (its engines are loaded) is for people and tests."""
    record = {"queue": own_queue(worker_name), "active": active, "seen": time.time(),
              "ready": ready}
    if models is not None:
        record["models"] = list(models)
    client().hset(_registry_key(), worker_name, json.dumps(record))


def forget(worker_name: str) -> None:
    client().hdel(_registry_key(), worker_name)


def workers() -> list[WorkerState]:
    """Every registered worker, live or not (see is_live)."""
    out = []
    for name, raw in client().hgetall(_registry_key()).items():
        try:
            record = json.loads(raw)
            models = record.get("models")
            out.append(WorkerState(name=name.decode(), queue=record["queue"],
                                   active=int(record.get("active", 0)),
                                   seen=float(record["seen"]),
                                   models=tuple(map(str, models)) if models is not None else None))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def is_live(worker: WorkerState, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    return now - worker.seen <= MISSED_BEATS * settings.CELERY_WORKER_HEARTBEAT_S


def _lists(queue: str) -> list[str]:
    return [queue] + [f"{queue}{_PRIORITY_SEP}{p}" for p in _PRIORITY_STEPS]


def queue_length(queue: str) -> int:
    pipe = client().pipeline()
    for name in _lists(queue):
        pipe.llen(name)
    return sum(pipe.execute())


def sweep_dead(now: float | None = None) -> int:
    """Move the tasks queued for dead workers to the shared queue; returns how many moved.

    A dead worker stays registered until the broker's visibility timeout has passed
    twice over: a task it held comes back to its queue only after that timeout.
    """
    now = time.time() if now is None else now
    moved = 0
    redis = client()
    shared = settings.CELERY_SHARED_QUEUE
    for worker in workers():
        if is_live(worker, now):
            continue
        for source, target in zip(_lists(worker.queue), _lists(shared), strict=True):
            # Oldest first (kombu pushes on the left and pops on the right).
            while redis.rpoplpush(source, target) is not None:
                moved += 1
        if now - worker.seen > 2 * settings.CELERY_VISIBILITY_TIMEOUT:
            forget(worker.name)
    if moved:
        log.warning("Moved %d task(s) of dead workers to the shared queue %s", moved, shared)
    return moved


# -- affinity of stateless conversations (/v1) ---------------------------------------


def _affinity_key(key: str) -> str:
    return f"prefixchat:affinity:{settings.CELERY_SHARED_QUEUE}:{key}"


def remember_affinity(key: str, worker_name: str) -> None:
    """`worker_name` holds the prefix named by `key` now (for as long as replies' ids are
    remembered: a client coming back later finds it there, or the blocks are gone anyway)."""
    if key:
        client().set(_affinity_key(key), worker_name, ex=settings.API_REMEMBER_IDS_TTL_S)


def affinity(key: str) -> str:
    if not key:
        return ""
    value = client().get(_affinity_key(key))
    return value.decode() if value else ""

