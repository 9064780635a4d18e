"""Where a generation runs: on this process's embedded engine, or on a Celery worker
(one rule for chat replies and /v1 requests: reply_goes_to_worker).

The user's message and the pending reply are stored before the task is queued, so when
the broker is down nothing is lost: the reply is marked failed with a message saying
so, the caller gets GenerationUnavailable, and regenerating it later works.
"""

from __future__ import annotations

import logging

from django.conf import settings
from kombu.exceptions import OperationalError

from chatapp.celery import app as celery_app
from chatapp.chat.errors import ChatError
from chatapp.chat.models import Message
from chatapp.generation import lifecycle, registry, router
from chatapp.generation.embedded import loaded_engine

log = logging.getLogger(__name__)

UNAVAILABLE = (
    "The reply could not be queued: the generation service is unavailable. "
    "Your message is saved; regenerate the reply in a moment."
)


class GenerationUnavailable(ChatError):
    code = "generation_unavailable"
    http_status = 503


def reply_goes_to_worker(
    *, max_new_tokens: int, embedded_waiting: int | None, broker_configured: bool,
    min_tokens: int, max_waiting: int,
) -> bool:
    """The rule, on plain values: with a broker, a generation allowed at least `min_tokens`
    new tokens goes to a worker (the web process stays free), and so does every one while
    the embedded engine has `max_waiting` requests waiting; a threshold at 0 is off."""
    if not broker_configured:
        return False
    if min_tokens > 0 and max_new_tokens >= min_tokens:
        return True
    return max_waiting > 0 and embedded_waiting is not None and embedded_waiting >= max_waiting


def use_worker(*, max_new_tokens: int, model: str = "") -> bool:
    """Whether a generation of `model` allowed `max_new_tokens` goes to a Celery worker
    (one that hosts the model: the router's choice)."""
    broker_configured = bool(settings.CELERY_BROKER_URL)
    max_waiting = settings.CELERY_EMBEDDED_MAX_WAITING
    engine = loaded_engine(model)
    waiting = None
    # The engine's snapshot is read only when its queue can decide (not on every send).
    if broker_configured and max_waiting > 0 and engine is not None:
        waiting = int(engine.metrics().get("num_waiting", 0))
    return reply_goes_to_worker(
        max_new_tokens=max_new_tokens,
        embedded_waiting=waiting,
        broker_configured=broker_configured,
        min_tokens=settings.CELERY_REPLY_MIN_TOKENS,
        max_waiting=max_waiting,
    )


REPLY_TASK = "chatapp.generation.generate_reply"
COMPLETION_TASK = "chatapp.generation.generate_completion"
SUMMARY_TASK = "chatapp.generation.generate_summary"
TITLE_TASK = "chatapp.generation.generate_title"


def enqueue_reply(*, reply: Message, model: str = "") -> str | None:
    """Queue the generation of the pending `reply`, a turn of `model`, on the queue the
    router picks; returns the queue, or None when no live worker hosts the model (it runs
    here). GenerationUnavailable, with the reply marked failed, if the broker is down."""
    queue = router.queue_for_reply(reply, model=model)
    if queue is None:
        return None
    try:
        celery_app.send_task(REPLY_TASK, (reply.pk,), queue=queue, retry=True)
    except OperationalError:
        log.exception("Queueing reply %s failed", reply.pk)
        reply.refresh_from_db()
        lifecycle.reply_finish(reply=reply, status=Message.Status.ERROR,
                               finish_reason="error", error=UNAVAILABLE)
        raise GenerationUnavailable(UNAVAILABLE) from None
    return queue


def completion_queue(*, max_tokens: int, affinity: str, model: str = "") -> str | None:
    """The worker queue a /v1 request for `model` goes to, or None to run it here (also
    when no live worker hosts the model). Streaming back needs the worker registry's
    Redis, so with another broker requests stay here."""
    if not registry.available() or not use_worker(max_new_tokens=max_tokens, model=model):
        return None
    return router.queue_for(preferred=router.affinity_worker(affinity), model=model)


def enqueue_completion(*, job: dict, channel: str, queue: str) -> None:
    """Queue a /v1 request for a worker, which streams to `channel`."""
    try:
        celery_app.send_task(COMPLETION_TASK, (job, channel), queue=queue, retry=True)
    except OperationalError:
        log.exception("Queueing completion %s failed", job.get("request_id"))
        raise GenerationUnavailable(
            "The request could not be queued: the generation service is unavailable. "
            "Try again in a moment."
        ) from None


def enqueue_summary(*, summary_id: int, max_tokens: int, preferred: str, model: str = "") -> bool:
    """Queue the generation of history summary `summary_id` (at most `max_tokens`),
    preferring `preferred`, the engine that served the turn that made the cut (it holds
    the turns to summarise); False: it runs here (enqueue_background)."""
    return enqueue_background(SUMMARY_TASK, summary_id, what="history summary",
                              max_tokens=max_tokens, preferred=preferred, model=model)


def enqueue_title(*, title_id: int, max_tokens: int, preferred: str, model: str = "") -> bool:
    """Queue the generation of conversation title `title_id`, preferring `preferred`, the
    engine that served the first reply (it holds the prompt the title extends); False: it
    runs here (enqueue_background)."""
    return enqueue_background(TITLE_TASK, title_id, what="conversation title",
                              max_tokens=max_tokens, preferred=preferred, model=model)


def enqueue_background(task: str, object_id: int, *, what: str, max_tokens: int,
                       preferred: str, model: str = "") -> bool:
    """Queue background generation `task` for row `object_id` on a worker when the rule
    says so (at most `max_tokens`), preferring the worker `preferred`; False: it runs here.
    A broker that is down leaves it to run here too: background work is never worth an
    error."""
    if not use_worker(max_new_tokens=max_tokens, model=model):
        return False
    queue = router.queue_for(preferred=preferred if registry.available() else "", model=model)
    if queue is None:
        return False
    try:
        celery_app.send_task(task, (object_id,), queue=queue, retry=True)
    except OperationalError:
        log.warning("Queueing %s %s failed; generating it here", what, object_id,
                    exc_info=True)
        return False
    return True
