"""Cache-affinity routing: send a turn to the worker whose engine holds its prefix, since
each worker's prefix cache is its own (the rule: docs/deployment.md, "Routing"). Only a
worker that hosts the turn's model (it advertises its models in its heartbeat) is a
candidate; when no live worker hosts it, the turn runs on this process's engine.

A stateless /v1 conversation has no row: its turns are known by the tenant's salt and
the prompt up to the end of its first non-system message (conversation_key), and the
worker that ran the last turn of that key is preferred.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from django.conf import settings

from chatapp.chat.models import Message
from chatapp.generation import registry, served_models

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    name: str
    queue: str
    queued: int  # tasks waiting in its own queue
    active: int  # tasks it runs now
    # The models (aliases) it hosts; None: it does not say (a worker from before several
    # models), taken to host any.
    models: tuple[str, ...] | None = None

    def hosts(self, model: str) -> bool:
        return self.models is None or model in self.models


def choose_queue(
    *, preferred: str, candidates: list[Candidate], max_queue: int, shared_queue: str,
    model: str = "",
) -> str | None:
    """The queue for a turn of `model`, given the live workers (a pure rule, tested on its
    own); None when live workers exist and none hosts the model (the caller runs it here).
    The shared queue, which every worker consumes, is used only when every live worker
    hosts the model; otherwise a hosting worker's own queue, the least loaded if all are
    saturated."""
    hosting = [c for c in candidates if c.hosts(model)]
    if candidates and not hosting:
        return None
    every_host = len(hosting) == len(candidates)
    by_name = {c.name: c for c in hosting}
    best = by_name.get(preferred)
    if best is not None and best.queued <= max_queue:
        return best.queue
    def load(c: Candidate) -> tuple[int, str]:
        return c.queued + c.active, c.name

    if not preferred and every_host:
        return shared_queue
    # The preferred worker is gone or saturated: the least-loaded other one, if it has room.
    others = [c for c in hosting if c.name != preferred and c.queued <= max_queue]
    if others:
        return min(others, key=load).queue
    return shared_queue if every_host else min(hosting, key=load).queue


def preferred_worker(reply: Message) -> str:
    """The engine most likely to hold the prompt of `reply` in its prefix cache: the one
    that served the conversation's last reply, else the same owner's, preset's and
    model's."""

    def last_server(**filters) -> str:
        return (
            Message.objects.filter(role=Message.Role.ASSISTANT, **filters)
            .exclude(served_by="").exclude(pk=reply.pk)
            .order_by("-id").values_list("served_by", flat=True).first()
        ) or ""

    return last_server(conversation_id=reply.conversation_id) or last_server(
        conversation__owner_id=reply.conversation.owner_id,
        conversation__preset_id=reply.conversation.preset_id,
        conversation__preset_version=reply.conversation.preset_version,
        conversation__model=reply.conversation.model,
    )


def live_candidates() -> list[Candidate]:
    return [Candidate(name=w.name, queue=w.queue, queued=registry.queue_length(w.queue),
                      active=w.active, models=w.models)
            for w in registry.workers() if registry.is_live(w)]


def queue_for_reply(reply: Message, *, model: str = "") -> str | None:
    """The queue the generation task of `reply` (a turn of `model`, as its conversation
    stores it) goes to; None: no live worker hosts the model."""
    return queue_for(preferred=preferred_worker(reply) if registry.available() else "",
                     model=model)


def queue_for(*, preferred: str, model: str = "") -> str | None:
    """The queue for a generation of `model` (an alias or the stored blank of the default)
    whose prefix `preferred` (a worker, or "") likely holds; None: no live worker hosts
    the model."""
    shared = settings.CELERY_SHARED_QUEUE
    if not registry.available():
        return shared
    try:
        candidates = live_candidates()
    except Exception:
        # The registry is unreadable (Redis down?): publishing will tell the user if so.
        log.warning("Reading the worker registry failed; using the shared queue", exc_info=True)
        return shared
    return choose_queue(preferred=preferred, candidates=candidates,
                        max_queue=settings.CELERY_AFFINITY_MAX_QUEUE, shared_queue=shared,
                        model=served_models.alias_of(model))


def conversation_key(*, cache_salt: str, plan, model: str = "") -> str:
    """A stateless conversation's name: its model, its tenant's salt and its prompt up to
    the end of the first message after the system prompt (and the marker of a history
    cut, which every cut conversation shares); every later turn starts the same way."""
    end = next((seg.end for seg in plan.segments if seg.kind not in ("system", "cut")),
               len(plan.token_ids))
    digest = hashlib.sha256(f"{model}\0{cache_salt}".encode())
    digest.update(",".join(map(str, plan.token_ids[:end])).encode())
    return digest.hexdigest()[:32]


def prompt_key(*, cache_salt: str, token_ids, model: str = "", tokens: int = 64) -> str:
    """A text completion's name for worker affinity: its model, its tenant's salt and its
    first `tokens` prompt tokens (a few blocks), which prompts that share a prefix share."""
    digest = hashlib.sha256(f"{model}\0{cache_salt}".encode())
    digest.update(",".join(map(str, list(token_ids)[:tokens])).encode())
    return digest.hexdigest()[:32]


def affinity_worker(key: str) -> str:
    try:
        return registry.affinity(key)
    except Exception:
        log.warning("Reading the affinity of %s failed", key, exc_info=True)
        return ""
