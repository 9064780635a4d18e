"""Celery tasks. Thin: the work is in chatapp.generation.worker and the services."""

from __future__ import annotations

from celery import shared_task

from chatapp.chat.services import Claim
from chatapp.generation import worker


@shared_task(
    bind=True,
    name="chatapp.generation.generate_reply",
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
)
def generate_reply(self, reply_id: int) -> dict:
    """Generate the pending reply `reply_id`, streaming it to its conversation's group.

    Idempotent by reply id: a copy delivered while another generation holds the reply
    comes back later; one delivered after the reply ended does nothing.
    """
    from django.conf import settings

    result = worker.generate(reply_id, holder=worker.worker_name(self.request.hostname))
    if result["outcome"] == Claim.BUSY:
        raise self.retry(countdown=max(1.0, settings.CHAT_HEARTBEAT_S))
    return result
