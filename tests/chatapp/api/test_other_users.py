"""Every endpoint that names a conversation (or something in it) answers another user's
exactly as a missing one: 404, nothing changed, nothing told."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from chatapp.chat import services
from chatapp.chat.models import Conversation
from tests.chatapp.api.conftest import api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def as_bob(bob) -> APIClient:
    return api_as(bob)


@pytest.fixture
def theirs(alice) -> Conversation:
    return services.conversation_create(owner=alice, title="alice's")


def test_organising_another_users_conversation_is_a_404(as_bob, theirs):
    for body in ({"pinned": True}, {"archived": True}, {"tags": ["mine"]}):
        r = as_bob.patch(f"/api/conversations/{theirs.pk}/", body, format="json")
        missing = as_bob.patch(f"/api/conversations/{theirs.pk + 1000}/", body, format="json")
        assert r.status_code == missing.status_code == 404
        assert r.json() == missing.json()
    theirs.refresh_from_db()
    assert (theirs.pinned, theirs.archived, theirs.tags.count()) == (False, False, 0)
    # Nor does a filter show it.
    assert as_bob.get("/api/conversations/", {"search": "alice"}).json()["results"] == []
