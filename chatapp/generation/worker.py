"""The Celery worker's side: its queue, its engine, its heartbeat, and running one task.

The worker adds its own queue, named after its hostname (so no -Q is needed). Its
engine id is that hostname too (with each model's alias under LLM_MODELS), so the
dashboard shows one row per worker and model, and the reply's `served_by` names the
queue the router sends the next turn to. Its heartbeat advertises the models it hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from celery.signals import celeryd_after_setup, worker_process_init, worker_process_shutdown
from django.conf import settings
from django.db import close_old_connections

from chatapp.generation import registry, remote, replies, served_models, summaries, titles
from chatapp.generation.embedded import get_engine, loaded_engine
from chatapp.generation.jobs import Job
from chatapp.generation.lifecycle import Claim, reply_claim

log = logging.getLogger(__name__)

_name = ""  # this worker's hostname, once set up
_concurrency = 0  # its pool size
_active = 0
_beats: threading.Event | None = None


@celeryd_after_setup.connect
def _setup_worker(sender: str, instance, **kwargs) -> None:
    """In the worker's main process, before the pool forks: its queue and engine id."""
    global _name, _concurrency
    _name = str(sender)
    _concurrency = int(getattr(instance, "concurrency", 0) or 0)
    if registry.available():
        instance.app.amqp.queues.select_add(registry.own_queue(_name))
    # Every worker of one host would otherwise share the web's default id.
    settings.LLM_ENGINE_ID = _name


@worker_process_init.connect
def _start_child(**kwargs) -> None:
    """In the pool child (which chatapp.startup starts like a web process): beat."""
    if _name and registry.available():
        global _beats
        _beats = threading.Event()
        threading.Thread(target=_beat_loop, args=(_beats,), name="worker-beat",
                         daemon=True).start()


@worker_process_shutdown.connect
def _stop_child(**kwargs) -> None:
    if _beats is not None:
        _beats.set()
        try:
            registry.forget(_name)
        except Exception:
            log.warning("Leaving the worker registry failed", exc_info=True)


def _beat_once() -> None:
    try:
        registry.beat(_name, active=_active, ready=loaded_engine() is not None,
                      models=served_models.aliases())
        registry.sweep_dead()
    except Exception:
        log.warning("Worker heartbeat failed", exc_info=True)


def _beat_loop(stopped: threading.Event) -> None:
    while True:
        _beat_once()
        if stopped.wait(settings.CELERY_WORKER_HEARTBEAT_S):
            return


def worker_name(hostname: str | None) -> str:
    return _name or hostname or settings.LLM_ENGINE_ID


def generate(reply_id: int, *, holder: str) -> dict:
    """Run the task for reply `reply_id`: claim it, generate it, report the outcome.

    {"outcome": "generated" | "superseded" | "finished" | "gone" | "busy", ...}; "busy"
    means another live generation holds the reply and the caller should try again later.
    """
    close_old_connections()
    # The model first (a fresh pool child loads it now): a load can starve the reply's
    # heartbeat for longer than CHAT_ORPHAN_S, and a claimed reply would then look dead.
    # Unclaimed, it waits as a queued one. A load that fails is reported by run_reply.
    with contextlib.suppress(Exception):
        get_engine(replies.reply_model(reply_id))
    # With one pool child, prefetch 1 and late acks, this worker gets no other task while
    # it generates: a reply it holds already was left by a child that was killed.
    outcome, lease = reply_claim(reply_id=reply_id, holder=holder, reclaim_own=_concurrency == 1)
    if outcome != Claim.CLAIMED:
        return {"reply_id": reply_id, "outcome": outcome, "worker": holder}
    # A fresh event loop per task: the engine streams to whichever loop asks, and a
    # soft time limit raised in here cancels run_reply, which keeps the partial text.
    with _busy():
        final = asyncio.run(replies.run_reply(reply_id, lease=lease))
    if not final:  # taken over by another worker meanwhile, or deleted: nothing written
        return {"reply_id": reply_id, "outcome": "superseded", "worker": holder}
    return {"reply_id": reply_id, "outcome": "generated", "worker": holder,
            "status": final.get("status")}


def complete(job: dict, channel: str, *, holder: str) -> dict:
    """Run a /v1 request for the web process that streams it from `channel`; this worker
    then holds the conversation's prefix, so its next turn is routed here."""
    request = Job.from_dict(job)
    # Recorded first: the client may send its next turn as soon as the stream ends.
    try:
        registry.remember_affinity(request.affinity, holder)
    except Exception:
        log.warning("Recording the affinity of %s failed", request.request_id, exc_info=True)
    with _busy():
        result = asyncio.run(remote.serve(request, channel))
    return {**result, "request_id": request.request_id, "worker": holder}


def summarise(summary_id: int, *, holder: str) -> dict:
    """Run the task for history summary `summary_id`: {"outcome": its status after}."""
    with _busy():
        status = asyncio.run(summaries.generate(summary_id))
    return {"summary_id": summary_id, "outcome": status, "worker": holder}


def write_title(title_id: int, *, holder: str) -> dict:
    """Run the task for conversation title `title_id`: {"outcome": its status after}."""
    with _busy():
        status = asyncio.run(titles.generate(title_id))
    return {"title_id": title_id, "outcome": status, "worker": holder}


@contextlib.contextmanager
def _busy():
    """Count a running task: the router sees the load now, not at the next beat."""
    global _active
    close_old_connections()
    _active += 1
    _beat_once()
    try:
        yield
    finally:
        _active -= 1
        _beat_once()
        close_old_connections()

