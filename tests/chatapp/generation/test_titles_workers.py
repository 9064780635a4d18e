"""A title the model writes, on a real Celery worker: the worker that generated the first
reply queues the title's task after it (the dispatch rule sends generations to workers),
generates it from the prefix it still holds, and stores it. Skipped unless DATABASE_URL
names PostgreSQL and REDIS_URL is set.

The model is the tiny random one: what the title says does not matter here."""

from __future__ import annotations

import json
import uuid

import pytest
from django_celery_results.models import TaskResult

from chatapp.chat import services
from chatapp.chat.models import Conversation, GeneratedTitle, Message
from tests.chatapp.e2e.conftest import ARTIFACTS
from tests.chatapp.generation.conftest import (
    WORKER_REDIS_DB,
    Cluster,
    _require_services,
    cluster_env,
    redis_url_with_db,
    wait_for,
)
from tests.inference.conftest import make_tiny_model

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

BLOCK = 16


@pytest.fixture(scope="module")
def title_cluster(django_db_setup, django_db_blocker, tmp_path_factory):
    """One worker serving the tiny model with titles on."""
    _, redis_url = _require_services()
    ARTIFACTS.mkdir(exist_ok=True)
    model = make_tiny_model(tmp_path_factory.mktemp("tiny-title-worker"), "llama", seed=3)
    layer_url = redis_url_with_db(redis_url, WORKER_REDIS_DB)
    shared = f"gen-test-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        env = cluster_env(layer_url, layer_url, shared)
    env.update(LLM_MODELS=f"tiny={model}", LLM_MAX_MODEL_LEN="1024", CHAT_MAX_NEW_TOKENS="24",
               CHAT_TITLES="1")
    cluster = Cluster(env=env, broker_url=layer_url, shared_queue=shared)
    try:
        worker = cluster.start_worker("title")
        cluster.wait_ready(worker)
        yield cluster
    finally:
        cluster.stop()


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
