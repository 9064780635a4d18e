"""Conversation and message-tree rules, on the real database."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from chatapp.chat import selectors, services
from chatapp.chat.errors import Busy, InvalidInput, NotFound
from chatapp.chat.models import Conversation, Message
from chatapp.generation import lifecycle

pytestmark = pytest.mark.django_db


def finish(reply: Message, text: str = "ok") -> Message:
    return lifecycle.reply_finish(
        reply=reply, status=Message.Status.DONE, content=text,
        generated_token_ids=[1, 2], segment_token_ids=[5, 1, 2, 6],
        prompt_tokens=40, cached_tokens=32, ttft=0.05, finish_reason="stop",
    )


def test_send_creates_user_message_and_pending_reply_and_titles_the_conversation(alice):
    conv = services.conversation_create(owner=alice)
    user_msg, reply = services.message_send(conversation=conv, content="How do prefix caches work?")
    conv.refresh_from_db()
    assert user_msg.parent is None and reply.parent == user_msg
    assert reply.status == Message.Status.PENDING and reply.role == "assistant"
    assert conv.title == "How do prefix caches work?"
    assert conv.current_leaf == reply


def test_second_turn_follows_the_current_leaf(alice):
    conv = services.conversation_create(owner=alice)
    _, r1 = services.message_send(conversation=conv, content="one")
    finish(r1)
    conv.refresh_from_db()
    u2, _ = services.message_send(conversation=conv, content="two")
    assert u2.parent == r1
    path = selectors.message_path(message=u2)
    assert [m.content for m in path] == ["one", "ok", "two"]


def test_a_second_send_while_a_reply_runs_is_refused(alice):
    conv = services.conversation_create(owner=alice)
    services.message_send(conversation=conv, content="one")
    with pytest.raises(Busy):
        services.message_send(conversation=conv, content="two")
    assert Message.objects.filter(conversation=conv).count() == 2


@pytest.mark.parametrize("content", ["", "   \n", None, 42])
def test_empty_or_non_text_messages_are_refused(alice, content):
    conv = services.conversation_create(owner=alice)
    with pytest.raises(InvalidInput):
        services.message_send(conversation=conv, content=content)
    assert not Message.objects.exists()


def test_a_message_over_the_limit_is_refused_with_its_length(alice, settings):
    settings.MAX_USER_MESSAGE_CHARS = 10
    conv = services.conversation_create(owner=alice)
    with pytest.raises(InvalidInput) as err:
        services.message_send(conversation=conv, content="x" * 11)
    assert err.value.code == "message_too_long" and "11" in err.value.message
    assert not Message.objects.exists()


def test_regenerate_and_edit_add_siblings_and_leave_originals_alone(alice):
    conv = services.conversation_create(owner=alice)
    u1, r1 = services.message_send(conversation=conv, content="first")
    finish(r1, "reply one")
    before = list(Message.objects.order_by("id").values())
    r2 = services.message_regenerate(conversation=conv, message_id=r1.pk)
    assert r2.parent_id == u1.pk and r2.pk != r1.pk
    finish(r2, "reply two")
    u1b, r3 = services.message_edit(conversation=conv, message_id=u1.pk, content="first, edited")
    assert u1b.parent_id == u1.parent_id and r3.parent_id == u1b.pk
    after = {m["id"]: m for m in Message.objects.values()}
    for old in before:
        assert after[old["id"]]["content"] == old["content"]
        assert after[old["id"]]["token_ids"] == old["token_ids"]
        assert after[old["id"]]["parent_id"] == old["parent_id"]


def test_messages_of_another_conversation_are_not_found(alice):
    a = services.conversation_create(owner=alice)
    b = services.conversation_create(owner=alice)
    _, r = services.message_send(conversation=a, content="hi")
    finish(r)
    with pytest.raises(NotFound):
        services.message_regenerate(conversation=b, message_id=r.pk)
    with pytest.raises(NotFound):
        services.message_send(conversation=b, content="x", parent_id=r.pk)


def test_another_users_conversation_looks_missing(alice, bob):
    conv = services.conversation_create(owner=alice)
    with pytest.raises(NotFound) as theirs:
        selectors.conversation_get(user=bob, conversation_id=conv.pk)
    with pytest.raises(NotFound) as missing:
        selectors.conversation_get(user=bob, conversation_id=conv.pk + 1000)
    assert theirs.value.message == missing.value.message


def test_search_matches_titles_and_message_text(alice, bob):
    c1 = services.conversation_create(owner=alice, title="Kernels")
    c2 = services.conversation_create(owner=alice)
    services.message_send(conversation=c2, content="tell me about paged attention")
    theirs = services.conversation_create(owner=bob, title="paged attention")
    assert list(selectors.conversation_list(user=alice, search="kern")) == [c1]
    assert list(selectors.conversation_list(user=alice, search="PAGED")) == [c2]
    assert theirs not in selectors.conversation_list(user=alice, search="paged")


def test_unknown_preset_is_refused(alice):
    with pytest.raises(InvalidInput) as err:
        services.conversation_create(owner=alice, preset_id="no-such-preset")
    assert "no-such-preset" in err.value.message
    assert not Conversation.objects.exists()


def test_ensure_admin_creates_one_admin_once(monkeypatch, capsys, django_user_model):
    monkeypatch.setenv("PREFIXCHAT_ADMIN_PASSWORD", "s3cret-pass")
    call_command("ensure_admin")
    call_command("ensure_admin")
    admins = django_user_model.objects.filter(is_superuser=True)
    assert admins.count() == 1 and admins[0].check_password("s3cret-pass")
    assert "exists" in capsys.readouterr().out


def test_ensure_admin_prints_a_generated_password(monkeypatch, capsys, django_user_model):
    monkeypatch.delenv("PREFIXCHAT_ADMIN_PASSWORD", raising=False)
    call_command("ensure_admin")
    out = capsys.readouterr().out
    admin = django_user_model.objects.get(is_superuser=True)
    password = out.split("with password ")[1].split("'")[1]
    assert admin.check_password(password)


def test_a_reply_queued_but_never_started_is_interrupted_after_the_stale_limit(alice):
    conv = services.conversation_create(owner=alice)
    _, orphan = services.message_send(conversation=conv, content="one")
    Message.objects.filter(pk=orphan.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    user_msg, _ = services.message_send(conversation=conv, content="two")
    orphan.refresh_from_db()
    assert orphan.status == Message.Status.INTERRUPTED and not orphan.token_ids
    # It holds no ids a prompt could take: the new turn goes beside the interrupted one.
    assert user_msg.parent is None


def test_after_a_failed_reply_a_new_message_branches_beside_the_failed_turn(alice):
    conv = services.conversation_create(owner=alice)
    _, r1 = services.message_send(conversation=conv, content="one")
    finish(r1)
    u2, r2 = services.message_send(conversation=conv, content="two")
    lifecycle.reply_finish(reply=r2, status=Message.Status.ERROR, error="boom")
    u3, _ = services.message_send(conversation=conv, content="two, again", parent_id=r2.pk)
    assert u3.parent_id == r1.pk and u2.parent_id == r1.pk


def test_a_replys_engine_request_id_is_spelled_by_the_model_alone(alice):
    conv = services.conversation_create(owner=alice)
    _, reply = services.message_send(conversation=conv, content="hi")
    assert reply.request_id == Message.request_id_for(reply.pk)
    assert Message.pk_from_request_id(reply.request_id) == reply.pk
    for other in ("gen-0a1b", "msg-", "msg-x1", "", "chatcmpl-7"):
        assert Message.pk_from_request_id(other) is None
