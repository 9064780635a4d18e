"""Celery tasks. Thin: the work is in chatapp.generation.worker and the services."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from chatapp.generation import worker
from chatapp.generation.dispatch import COMPLETION_TASK, REPLY_TASK, SUMMARY_TASK, TITLE_TASK
from chatapp.generation.lifecycle import Claim


@shared_task(
    bind=True,
    name=REPLY_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
)
def generate_reply(self, reply_id: int) -> dict:
    """Generate the pending reply `reply_id`, streaming it to its conversation's group;
    idempotent by reply id (a copy delivered while another generation holds it retries)."""
    result = worker.generate(reply_id, holder=worker.worker_name(self.request.hostname))
    if result["outcome"] == Claim.BUSY:
        raise self.retry(countdown=max(1.0, settings.CHAT_HEARTBEAT_S))
    return result


# Acknowledged on receipt: the client streams from this run alone, so a copy run again
# after a lost worker would write to a channel nobody reads (the client saw it fail).
@shared_task(bind=True, name=COMPLETION_TASK, acks_late=False, reject_on_worker_lost=False)
def generate_completion(self, job: dict, channel: str) -> dict:
    """Run a /v1 request, streaming its outputs to the web process's `channel`."""
    return worker.complete(job, channel, holder=worker.worker_name(self.request.hostname))


@shared_task(bind=True, name=SUMMARY_TASK, acks_late=True, reject_on_worker_lost=True)
def generate_summary(self, summary_id: int) -> dict:
    """Generate the pending history summary `summary_id`; idempotent by id (a copy finds it
    taken or done and changes nothing)."""
    return worker.summarise(summary_id, holder=worker.worker_name(self.request.hostname))


@shared_task(bind=True, name=TITLE_TASK, acks_late=True, reject_on_worker_lost=True)
def generate_title(self, title_id: int) -> dict:
    """Generate the pending conversation title `title_id`; idempotent by id (a copy finds
    it taken or done and changes nothing)."""
    return worker.write_title(title_id, holder=worker.worker_name(self.request.hostname))
