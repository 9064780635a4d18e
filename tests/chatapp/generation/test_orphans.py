"""Replies whose process died: finished as interrupted with their persisted text, found
by the heartbeat rule (any host) or at once (a dead pid on this host); Continue."""

import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from chatapp.chat import services
from chatapp.chat.errors import Busy, InvalidInput
from chatapp.chat.models import Message
from chatapp.generation import lifecycle, orphans

pytestmark = pytest.mark.django_db


def dead_runner() -> str:
    """The runner name of a process of this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    host = orphans.this_runner().split(":")[0]
    return f"{host}:{proc.pid}:deadbeef"


def streaming_reply(alice, *, runner: str, age_s: float = 0.0):
    """A first turn whose reply was streaming under `runner`, with text and ids persisted."""
    conv = services.conversation_create(owner=alice)
    user_msg, reply = services.message_send(conversation=conv, content="Tell me a story.")
    Message.objects.filter(pk=reply.pk).update(
        status=Message.Status.STREAMING, runner=runner, content="Once upon",
        generated_token_ids=[11, 12], token_ids=[1, 11, 12, 2], prompt_tokens=30,
        completion_tokens=2, updated_at=timezone.now() - timedelta(seconds=age_s))
    return conv, user_msg, reply


def test_a_reply_of_a_dead_process_on_this_host_is_interrupted_at_once(alice):
    conv, _, reply = streaming_reply(alice, runner=dead_runner())
    assert orphans.recover(conversation=conv) == [reply.pk]
    reply.refresh_from_db()
    assert reply.status == Message.Status.INTERRUPTED and reply.finish_reason == "interrupted"
    # The text, ids and usage persisted by its heartbeat stay.
    assert reply.content == "Once upon" and reply.generated_token_ids == [11, 12]
    assert reply.completion_tokens == 2 and reply.token_ids == [1, 11, 12, 2]


def test_a_live_reply_is_left_alone(alice):
    conv, _, reply = streaming_reply(alice, runner=orphans.this_runner())
    other_host = streaming_reply(alice, runner="elsewhere:1:abc")[0]
    assert orphans.recover(conversation=conv) == []
    assert orphans.recover(conversation=other_host) == []  # cannot tell: heartbeat decides
    reply.refresh_from_db()
    assert reply.status == Message.Status.STREAMING


def test_a_reply_untouched_past_the_orphan_limit_is_interrupted_whatever_its_host(
    alice, settings
):
    settings.CHAT_ORPHAN_S = 10
    conv, _, reply = streaming_reply(alice, runner="elsewhere:1:abc", age_s=11)
    assert orphans.recover(conversation=conv) == [reply.pk]


def test_the_next_message_continues_the_branch_of_an_interrupted_reply(alice):
    conv, _, reply = streaming_reply(alice, runner=dead_runner())
    with pytest.raises(Busy):  # the chat's own rule alone: not stale yet
        services.message_send(conversation=conv, content="Go on.")
    orphans.recover(conversation=conv)  # as the page, the socket and the API do first
    user_msg, _ = services.message_send(conversation=conv, content="Go on.")
    assert user_msg.parent_id == reply.pk


def test_a_worker_s_copy_of_the_task_finds_a_dead_generation_s_reply_interrupted(alice):
    _, _, reply = streaming_reply(alice, runner=dead_runner())
    outcome, lease = lifecycle.reply_claim(reply_id=reply.pk, holder="w2")
    assert (outcome, lease) == (lifecycle.Claim.FINISHED, "")
    reply.refresh_from_db()
    assert reply.status == Message.Status.INTERRUPTED and reply.content == "Once upon"


def test_a_live_generation_s_reply_is_busy_for_a_second_copy(alice):
    _, _, reply = streaming_reply(alice, runner=orphans.this_runner())
    assert lifecycle.reply_claim(reply_id=reply.pk, holder="w2")[0] == lifecycle.Claim.BUSY


def test_a_generation_whose_reply_was_interrupted_writes_nothing_more(alice):
    runner = orphans.this_runner()
    conv, _, reply = streaming_reply(alice, runner=runner)
    assert lifecycle.reply_persist(reply_id=reply.pk, runner=runner,
                                   progress={"content": "Once upon a"})
    services.replies_interrupt(replies=Message.objects.filter(pk=reply.pk))
    assert not lifecycle.reply_persist(reply_id=reply.pk, runner=runner,
                                       progress={"content": "Once upon a time"})
    assert lifecycle.reply_finish_held(reply_id=reply.pk, runner=runner,
                                       status=Message.Status.DONE, content="x") is None
    reply.refresh_from_db()
    assert reply.content == "Once upon a" and reply.status == Message.Status.INTERRUPTED


def test_continue_puts_a_cut_short_reply_back_to_pending(alice):
    conv, _, reply = streaming_reply(alice, runner=dead_runner())
    orphans.recover(conversation=conv)
    continued = services.message_continue(conversation=conv, message_id=reply.pk)
    assert continued.pk == reply.pk and continued.status == Message.Status.PENDING
    assert continued.content == "Once upon" and continued.runner == ""
    conv.refresh_from_db()
    assert conv.current_leaf_id == reply.pk


def test_continue_refuses_a_finished_reply_and_one_with_replies_after_it(alice):
    conv, _, reply = streaming_reply(alice, runner=dead_runner())
    orphans.recover(conversation=conv)
    services.message_send(conversation=conv, content="Go on.")
    done = Message.objects.filter(conversation=conv, role="assistant").exclude(pk=reply.pk)
    lifecycle.reply_finish(reply=done.get(), status=Message.Status.DONE, content="ok",
                           generated_token_ids=[5], segment_token_ids=[1, 5, 2],
                           finish_reason="stop")
    with pytest.raises(InvalidInput, match="last reply"):
        services.message_continue(conversation=conv, message_id=reply.pk)
    with pytest.raises(InvalidInput, match="interrupted, stopped"):
        services.message_continue(conversation=conv, message_id=done.get().pk)


def test_a_read_shows_an_orphan_as_interrupted_and_writes_nothing(alice, client):
    """The page, its messages.json and the API's tree show a dead process's reply as
    interrupted at once; the row itself is left for the sweep (a GET writes nothing)."""
    conv, _, reply = streaming_reply(alice, runner=dead_runner())
    client.force_login(alice)
    page = client.get(f"/c/{conv.pk}/")
    tree = client.get(f"/c/{conv.pk}/messages.json").json()
    assert page.status_code == 200
    seen = {m["id"]: m for m in tree["messages"]}[reply.pk]
    assert (seen["status"], seen["can_continue"]) == ("interrupted", True)
    reply.refresh_from_db()
    assert reply.status == Message.Status.STREAMING
    assert orphans.recover(conversation=conv) == [reply.pk]


def test_the_api_s_message_tree_shows_an_orphan_as_interrupted_and_writes_nothing(alice):
    from rest_framework.test import APIClient

    conv, _, reply = streaming_reply(alice, runner=dead_runner())
    api = APIClient()
    api.force_authenticate(alice)
    response = api.get(f"/api/conversations/{conv.pk}/messages/")
    assert response.status_code == 200, response.content
    seen = {m["id"]: m for m in response.json()["messages"]}[reply.pk]
    assert seen["status"] == "interrupted"
    reply.refresh_from_db()
    assert reply.status == Message.Status.STREAMING
