"""Which replies go to workers, which worker, and the reply claim that makes the task
idempotent: the rules on their own, no worker process needed."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError

from chatapp.chat import services
from chatapp.chat.models import Message
from chatapp.generation import dispatch, lifecycle, registry, replies, router
from chatapp.generation.lifecycle import Claim
from chatapp.generation.router import Candidate, choose_queue


def cand(name: str, queued: int = 0, active: int = 0) -> Candidate:
    return Candidate(name=name, queue=f"q.{name}", queued=queued, active=active)


class TestChooseQueue:
    def choose(self, preferred: str, *candidates: Candidate, max_queue: int = 2) -> str:
        return choose_queue(preferred=preferred, candidates=list(candidates),
                            max_queue=max_queue, shared_queue="shared")

    def test_a_conversation_stays_on_the_worker_that_served_it(self):
        assert self.choose("a", cand("a", queued=2, active=1), cand("b")) == "q.a"

    def test_an_overloaded_preferred_worker_hands_over_to_the_least_loaded(self):
        chosen = self.choose("a", cand("a", queued=3), cand("b", queued=1, active=1),
                             cand("c", queued=1))
        assert chosen == "q.c"

    def test_a_preferred_worker_that_is_gone_hands_over_too(self):
        assert self.choose("gone", cand("b", active=1), cand("c")) == "q.c"

    def test_without_a_preference_the_shared_queue_serves(self):
        assert self.choose("", cand("a"), cand("b")) == "shared"

    def test_when_every_worker_is_saturated_the_shared_queue_serves(self):
        assert self.choose("a", cand("a", queued=5), cand("b", queued=3)) == "shared"
        assert self.choose("a") == "shared"


class TestRule:
    def rule(self, **kw) -> bool:
        args = dict(max_new_tokens=512, embedded_waiting=0, broker_configured=True,
                    min_tokens=256, max_waiting=0)
        return dispatch.reply_goes_to_worker(**{**args, **kw})

    def test_long_replies_go_to_workers(self):
        assert self.rule()
        assert not self.rule(max_new_tokens=128)

    def test_without_a_broker_everything_runs_embedded(self):
        assert not self.rule(broker_configured=False)
        assert not self.rule(broker_configured=False, max_waiting=1, embedded_waiting=9)

    def test_a_full_embedded_queue_sends_replies_to_workers(self):
        assert self.rule(min_tokens=0, max_waiting=4, embedded_waiting=4)
        assert not self.rule(min_tokens=0, max_waiting=4, embedded_waiting=3)
        assert not self.rule(min_tokens=0, max_waiting=4, embedded_waiting=None)

    def test_zero_turns_a_part_off(self):
        assert not self.rule(min_tokens=0)

    def test_the_settings_feed_the_rule(self, settings):
        settings.CELERY_BROKER_URL = ""
        settings.CELERY_REPLY_MIN_TOKENS = 1
        assert not dispatch.use_worker(max_new_tokens=settings.CHAT_MAX_NEW_TOKENS)
        settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
        assert dispatch.use_worker(max_new_tokens=settings.CHAT_MAX_NEW_TOKENS)
        settings.CELERY_REPLY_MIN_TOKENS = 0
        assert not dispatch.use_worker(max_new_tokens=settings.CHAT_MAX_NEW_TOKENS)


def _turn(owner, preset_id=None, served_by=""):
    conversation = services.conversation_create(owner=owner, preset_id=preset_id)
    _, reply = services.message_send(conversation=conversation, content="Hi.")
    if served_by:
        lifecycle.reply_finish(reply=reply, status=Message.Status.DONE, content="Hello.",
                              generated_token_ids=[1], segment_token_ids=[1])
        Message.objects.filter(pk=reply.pk).update(served_by=served_by)
    return conversation, reply


@pytest.mark.django_db
class TestPreferredWorker:
    def test_the_worker_of_the_last_turn(self, alice):
        conversation, _ = _turn(alice, served_by="w1@h")
        _, reply = services.message_send(conversation=conversation, content="More.")
        assert router.preferred_worker(reply) == "w1@h"

    def test_a_new_conversation_prefers_a_worker_warm_for_its_owner_and_preset(self, alice, bob):
        _turn(alice, served_by="w1@h")
        _turn(bob, served_by="w2@h")  # another owner's blocks are salted apart
        _, reply = _turn(alice)
        assert router.preferred_worker(reply) == "w1@h"
        _, other_preset = _turn(alice, preset_id="coding")
        assert router.preferred_worker(other_preset) == ""

    def test_no_registry_means_the_shared_queue(self, alice, settings):
        settings.CELERY_BROKER_URL = "amqp://guest@127.0.0.1//"
        _, reply = _turn(alice)
        assert router.queue_for_reply(reply) == settings.CELERY_SHARED_QUEUE


@pytest.mark.django_db
class TestClaim:
    def test_one_claim_wins_and_a_second_delivery_waits(self, alice):
        _, reply = _turn(alice)
        outcome, lease = lifecycle.reply_claim(reply_id=reply.pk, holder="w1@h")
        assert outcome == Claim.CLAIMED and lease
        reply.refresh_from_db()
        assert (reply.status, reply.served_by, reply.lease) == ("streaming", "w1@h", lease)
        assert lifecycle.reply_claim(reply_id=reply.pk, holder="w2@h") == (Claim.BUSY, "")

    def test_a_worker_that_runs_one_task_at_a_time_finds_its_own_reply_orphaned(self, alice):
        _, reply = _turn(alice)
        lifecycle.reply_claim(reply_id=reply.pk, holder="w1@h")
        Message.objects.filter(pk=reply.pk).update(content="Once")
        # A redelivery to the same one-task worker: the first generation died with its
        # child, so the reply is finished as interrupted, its text kept.
        assert lifecycle.reply_claim(reply_id=reply.pk, holder="w1@h",
                                     reclaim_own=True) == (Claim.FINISHED, "")
        reply.refresh_from_db()
        assert (reply.status, reply.content) == (Message.Status.INTERRUPTED, "Once")
        assert lifecycle.reply_claim(reply_id=reply.pk, holder="w2@h") == (Claim.FINISHED, "")

    def test_a_generation_whose_heartbeat_stopped_is_interrupted(self, alice, settings):
        _, reply = _turn(alice)
        _, old = lifecycle.reply_claim(reply_id=reply.pk, holder="w1@h")
        runner = Message.objects.get(pk=reply.pk).runner
        stale = timezone.now() - timedelta(seconds=settings.CHAT_ORPHAN_S + 1)
        # Another host's generation (its pid cannot be checked from here) gone quiet.
        Message.objects.filter(pk=reply.pk).update(updated_at=stale, runner="far:1:x")
        assert lifecycle.reply_claim(reply_id=reply.pk, holder="w2@h") == (Claim.FINISHED, "")
        assert Message.objects.get(pk=reply.pk).status == Message.Status.INTERRUPTED
        # The interrupted generation may no longer write the reply, nor keep it alive
        # (its heartbeat says so, and the generation then aborts itself).
        assert lifecycle.reply_finish_held(reply_id=reply.pk, lease=old,
                                           status=Message.Status.DONE) is None
        assert lifecycle.reply_persist(reply_id=reply.pk, runner=runner, lease=old) is False

    def test_a_finished_reply_is_not_generated_again(self, alice):
        _, reply = _turn(alice, served_by="w1@h")
        assert lifecycle.reply_claim(reply_id=reply.pk, holder="w2@h") == (Claim.FINISHED, "")
        assert lifecycle.reply_claim(reply_id=10**9, holder="w2@h") == (Claim.GONE, "")

    def test_a_reply_stopped_while_queued_ends_without_generating(self, alice):
        _, reply = _turn(alice)
        replies.request_stop(reply.pk)  # not running in this process: the flag
        assert lifecycle.reply_claim(reply_id=reply.pk, holder="w1@h") == (Claim.FINISHED, "")
        reply.refresh_from_db()
        assert reply.status == Message.Status.STOPPED and reply.finish_reason == "abort"


@pytest.mark.django_db
def test_with_the_broker_down_the_turn_is_kept_and_the_reply_fails_clearly(alice, monkeypatch):
    from chatapp.celery import app

    def down(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(app, "send_task", down)
    conversation, reply = _turn(alice)
    with pytest.raises(dispatch.GenerationUnavailable) as exc:
        dispatch.enqueue_reply(reply=reply)
    assert exc.value.http_status == 503 and "saved" in exc.value.message
    reply.refresh_from_db()
    assert reply.status == Message.Status.ERROR and reply.error == dispatch.UNAVAILABLE
    assert Message.objects.get(pk=reply.parent_id).content == "Hi."
    # The failed reply does not block the conversation: it can be regenerated.
    assert services.message_regenerate(conversation=conversation, message_id=reply.pk)


@pytest.fixture
def redis_registry(settings):
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("needs REDIS_URL")
    settings.CELERY_BROKER_URL = url
    settings.CELERY_SHARED_QUEUE = f"registry-test-{uuid.uuid4().hex[:8]}"
    settings.CELERY_WORKER_HEARTBEAT_S = 1
    settings.CELERY_VISIBILITY_TIMEOUT = 5
    yield registry.client()
    keys = list(registry.client().scan_iter(f"{settings.CELERY_SHARED_QUEUE}*"))
    registry.client().delete(f"prefixchat:workers:{settings.CELERY_SHARED_QUEUE}", *keys)


def test_the_registry_sees_live_workers_and_rescues_the_queue_of_a_dead_one(
    redis_registry, settings
):
    registry.beat("live@h", active=1)
    registry.beat("dead@h", active=0)
    dead_queue = registry.own_queue("dead@h")
    redis_registry.lpush(dead_queue, "t1", "t2")  # t1 is the older: consumers pop the right
    assert registry.queue_length(dead_queue) == 2
    assert {c.name: c.queued for c in router.live_candidates()} == {"live@h": 0, "dead@h": 2}

    # "dead" misses three beats, "live" beats on.
    stale = {"queue": dead_queue, "active": 0, "seen": time.time() - 4}
    redis_registry.hset(f"prefixchat:workers:{settings.CELERY_SHARED_QUEUE}", "dead@h",
                        json.dumps(stale))
    assert [c.name for c in router.live_candidates()] == ["live@h"]
    assert registry.sweep_dead() == 2 and registry.queue_length(dead_queue) == 0
    shared = settings.CELERY_SHARED_QUEUE
    assert redis_registry.lrange(shared, 0, -1) == [b"t2", b"t1"]  # still oldest first
    # Forgotten only when no task it held can come back any more.
    assert "dead@h" in {w.name for w in registry.workers()}
    registry.sweep_dead(now=time.time() + 2 * settings.CELERY_VISIBILITY_TIMEOUT + 5)
    assert "dead@h" not in {w.name for w in registry.workers()}
