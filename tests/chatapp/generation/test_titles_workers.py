"""A title the model writes, on a real Celery worker: the worker that generated the first
reply queues the title's task after it (the dispatch rule sends generations to workers),
generates it from the prefix it still holds, and stores it. Skipped unless DATABASE_URL
names PostgreSQL and REDIS_URL is set.

The model is the tiny random one: what the title says does not matter here."""

from __future__ import annotations

import json

import pytest
from django_celery_results.models import TaskResult

from chatapp.chat import services
from chatapp.chat.models import Conversation, GeneratedTitle, Message
from tests.chatapp.generation.conftest import (
    tiny_worker,
    wait_for,
)

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

BLOCK = 16


@pytest.fixture(scope="module")
def title_cluster(django_db_setup, django_db_blocker, tmp_path_factory):
    """One worker serving the tiny model with titles on."""
    with tiny_worker(django_db_blocker, tmp_path_factory.mktemp("tiny-title-worker"), "title",
                     CHAT_MAX_NEW_TOKENS="24", CHAT_TITLES="1") as cluster:
        yield cluster


def test_the_first_reply_is_titled_by_the_worker_that_holds_its_prefix(title_cluster, alice):
    conversation = services.conversation_create(owner=alice)
    (worker,) = title_cluster.workers
    _, reply = services.message_send(
        conversation=conversation, content="Tell me about the number 7 and its neighbours.")
    title_cluster.send_task(reply.pk, title_cluster.shared_queue)
    wait_for(lambda: GeneratedTitle.objects.filter(conversation=conversation).exclude(
        status__in=(GeneratedTitle.Status.PENDING, GeneratedTitle.Status.RUNNING)).first(),
        what="the title")
    reply.refresh_from_db()
    assert reply.status == Message.Status.DONE and reply.served_by == worker, reply.error
    row = GeneratedTitle.objects.get(conversation=conversation)
    assert row.status == GeneratedTitle.Status.READY, row.error
    assert Conversation.objects.get(pk=conversation.pk).title == row.text
    # Its own task, on the worker that served the reply, from the prefix it holds.
    rows = TaskResult.objects.filter(status="SUCCESS", result__contains='"title_id"')
    results = [json.loads(r.result) for r in rows]
    assert [(r["outcome"], r["worker"]) for r in results if r["title_id"] == row.pk] == [
        ("ready", worker)]
    assert row.cached_tokens >= reply.prompt_tokens // BLOCK * BLOCK
