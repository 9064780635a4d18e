"""Feedback on replies: thumbs up or down with a comment through the API (one per user per
reply, changeable), the dashboard's counts per model and preset, and the staff-only CSV."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from chatapp.chat import services
from chatapp.chat.models import Feedback, Message
from chatapp.generation import lifecycle
from tests.chatapp.api.conftest import api_as

pytestmark = pytest.mark.django_db


def finished_turn(conv, text="hi") -> tuple[Message, Message]:
    user_msg, reply = services.message_send(conversation=conv, content=text)
    reply = lifecycle.reply_finish(reply=reply, status=Message.Status.DONE, content="hello",
                                   generated_token_ids=[3], segment_token_ids=[1, 3, 2],
                                   prompt_tokens=8, cached_tokens=0, ttft=0.1,
                                   finish_reason="stop")
    return user_msg, reply


@pytest.fixture
def api(alice) -> APIClient:
    return api_as(alice)


def url(conv, message) -> str:
    return f"/api/conversations/{conv.pk}/messages/{message.pk}/feedback/"


def test_rate_change_and_take_back(api, alice):
    conv = services.conversation_create(owner=alice, preset_id="coding")
    question, reply = finished_turn(conv)
    assert api.get(url(conv, reply)).status_code == 404  # none yet

    r = api.put(url(conv, reply), {"rating": "up"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["rating"] == "up" and r.json()["comment"] == ""
    r = api.put(url(conv, reply), {"rating": "down", "comment": " too short "}, format="json")
    assert r.json()["rating"] == "down" and r.json()["comment"] == "too short"
    assert Feedback.objects.count() == 1  # one per user per reply, changed in place
    assert api.get(url(conv, reply)).json()["rating"] == "down"

    assert api.delete(url(conv, reply)).status_code == 204
    assert not Feedback.objects.exists()


@pytest.mark.parametrize("body, field", [
    ({}, "rating"),
    ({"rating": "meh"}, "rating"),
    ({"rating": 1}, "rating"),
    ({"rating": "up", "comment": 5}, "comment"),
    ({"rating": "up", "comment": "x" * 2001}, "comment"),
])
def test_bad_feedback_is_a_400_naming_the_field(api, alice, body, field):
    conv = services.conversation_create(owner=alice)
    _, reply = finished_turn(conv)
    r = api.put(url(conv, reply), body, format="json")
    assert r.status_code == 400 and field in r.json()["errors"], r.content
    assert not Feedback.objects.exists()


def test_only_finished_replies_take_feedback(api, alice):
    conv = services.conversation_create(owner=alice)
    question, reply = finished_turn(conv)
    assert api.put(url(conv, question), {"rating": "up"}, format="json").status_code == 404
    _, pending = services.message_send(conversation=conv, content="more")
    r = api.put(url(conv, pending), {"rating": "up"}, format="json")
    assert r.status_code == 400 and "still being generated" in r.json()["detail"]


def test_another_users_reply_is_missing(alice, bob):
    conv = services.conversation_create(owner=alice)
    _, reply = finished_turn(conv)
    Feedback.objects.create(message=reply, user=alice, rating=1)
    client = api_as(bob)
    for method, body in (("get", None), ("put", {"rating": "down"}), ("delete", None)):
        theirs = getattr(client, method)(url(conv, reply), body, format="json")
        assert theirs.status_code == 404, method
    assert Feedback.objects.get().rating == 1 and Feedback.objects.count() == 1


def test_dashboard_counts_per_model_and_preset_and_staff_only_csv(client, alice, bob,
                                                                   admin_user):
    coding = services.conversation_create(owner=alice, preset_id="coding")
    general = services.conversation_create(owner=bob, preset_id="general")
    _, r1 = finished_turn(coding)
    _, r2 = finished_turn(general)
    Feedback.objects.create(message=r1, user=alice, rating=1, comment="=SUM(A1)")
    Feedback.objects.create(message=r2, user=bob, rating=-1)

    client.force_login(alice)
    assert client.get(reverse("dashboard:feedback-csv")).status_code == 302  # to admin login
    client.force_login(admin_user)
    page = client.get(reverse("dashboard:cache")).content.decode()
    assert 'id="feedback"' in page and "<td>coding</td>" in page and "<td>general</td>" in page

    response = client.get(reverse("dashboard:feedback-csv"))
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    by_preset = {r["preset"]: r for r in rows}
    assert by_preset["coding"]["rating"] == "up" and by_preset["general"]["rating"] == "down"
    assert by_preset["coding"]["comment"] == "'=SUM(A1)"  # never run as a formula
    assert by_preset["general"]["user"] == "bob"
