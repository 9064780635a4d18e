"""Usage rows: one per user, key, model and day, added to once per reply; the usage pages
show a user only their own, and everyone's (and the CSV) to administrators only."""

from __future__ import annotations

import csv
import io

import pytest

from chatapp.accounting.models import DailyUsage
from chatapp.accounting.services import ReplyUsage, reply_record
from chatapp.api import services
from chatapp.chat import services as chat_services
from chatapp.chat.models import Message
from chatapp.generation import lifecycle

pytestmark = pytest.mark.django_db


def test_replies_add_to_one_row_per_user_key_model_and_day(alice):
    key, _ = services.api_key_create(user=alice, name="t")
    reply_record(user=alice, key=key, model="m",
                 usage=ReplyUsage(prompt_tokens=10, cached_tokens=4, completion_tokens=3))
    reply_record(user=alice, key=key, model="m",
                 usage=ReplyUsage(prompt_tokens=5, completion_tokens=2), error=True)
    reply_record(user=alice, key=None, model="m", usage=ReplyUsage(prompt_tokens=1))
    rows = {(r.key_id, r.model): r for r in DailyUsage.objects.filter(user=alice)}
    assert len(rows) == 2
    row = rows[(key.pk, "m")]
    assert (row.requests, row.prompt_tokens, row.cached_tokens, row.completion_tokens,
            row.errors) == (2, 15, 4, 5, 1)
    assert rows[(None, "m")].requests == 1


def test_a_chat_reply_is_counted_once_as_it_ends(alice):
    conversation = chat_services.conversation_create(owner=alice)
    _, reply = chat_services.message_send(conversation=conversation, content="Hi.")
    lifecycle.reply_finish(reply=reply, status=Message.Status.DONE, content="Hello",
                           generated_token_ids=[1, 2, 3], prompt_tokens=20, cached_tokens=16)
    [row] = DailyUsage.objects.filter(user=alice)
    assert row.key is None
    assert (row.requests, row.prompt_tokens, row.cached_tokens, row.completion_tokens,
            row.errors) == (1, 20, 16, 3, 0)


def test_a_user_sees_only_their_own_usage(client, alice, bob):
    reply_record(user=alice, key=None, model="alice-model", usage=ReplyUsage(prompt_tokens=7))
    reply_record(user=bob, key=None, model="bob-model", usage=ReplyUsage(prompt_tokens=9))
    client.force_login(alice)
    page = client.get("/usage/")
    assert page.status_code == 200
    assert b"alice-model" in page.content and b"bob-model" not in page.content
    assert client.get("/usage/all/").status_code == 403
    assert client.get("/usage/all.csv").status_code == 403


def test_anonymous_visitors_are_sent_to_sign_in(client):
    for url in ("/usage/", "/usage/all/", "/usage/all.csv"):
        assert client.get(url).status_code == 302


def test_administrators_see_everyone_and_export_csv(client, alice, bob, django_user_model):
    admin = django_user_model.objects.create_user("root", is_staff=True)
    key, _ = services.api_key_create(user=alice, name="t")
    reply_record(user=alice, key=key, model="m", usage=ReplyUsage(prompt_tokens=7,
                                                                  completion_tokens=2))
    reply_record(user=bob, key=None, model="m", usage=ReplyUsage(prompt_tokens=9))
    client.force_login(admin)
    page = client.get("/usage/all/")
    assert page.status_code == 200
    assert b"alice" in page.content and b"bob" in page.content
    export = client.get("/usage/all.csv")
    assert export.status_code == 200 and export["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(export.content.decode())))
    assert {(r["user"], r["key"], r["prompt_tokens"]) for r in rows} == {
        ("alice", key.prefix, "7"), ("bob", "", "9")}
