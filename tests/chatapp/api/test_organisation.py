"""Pin, archive and tags through the conversations API: PATCH sets them, the list filters
by them, and bad values are 400s naming the field."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from chatapp.chat import services
from chatapp.chat.models import Conversation
from tests.chatapp.api.conftest import api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    return api_as(alice)


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [c["id"] for c in response.json()["results"]]


def test_pin_archive_and_tag_then_filter(api, alice):
    old, pinned, archived = (services.conversation_create(owner=alice, title=t)
                             for t in ("old plans", "pinned plans", "archived recipes"))
    before = Conversation.objects.get(pk=old.pk).updated_at

    r = api.patch(f"/api/conversations/{pinned.pk}/",
                  {"pinned": True, "tags": [" work ", "ideas", "work"]}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["pinned"] is True and r.json()["tags"] == ["ideas", "work"]
    assert api.patch(f"/api/conversations/{archived.pk}/", {"archived": True},
                     format="json").json()["archived"] is True
    api.patch(f"/api/conversations/{old.pk}/", {"tags": ["work"]}, format="json")
    # Organising is not activity: the list's order by time stays.
    assert Conversation.objects.get(pk=old.pk).updated_at == before

    assert set(ids(api.get("/api/conversations/"))) == {old.pk, pinned.pk}
    assert ids(api.get("/api/conversations/", {"archived": "true"})) == [archived.pk]
    # Archived is out of the list, not out of reach: a search finds it.
    assert ids(api.get("/api/conversations/", {"search": "recipes"})) == [archived.pk]
    assert ids(api.get("/api/conversations/", {"pinned": "true"})) == [pinned.pk]
    assert set(ids(api.get("/api/conversations/", {"tag": "work"}))) == {old.pk, pinned.pk}
    assert ids(api.get("/api/conversations/", {"tag": "ideas"})) == [pinned.pk]

    # Restore, and replace the tags (an empty list clears them).
    api.patch(f"/api/conversations/{archived.pk}/", {"archived": False}, format="json")
    cleared = api.patch(f"/api/conversations/{pinned.pk}/", {"tags": []}, format="json").json()
    assert cleared["tags"] == [] and cleared["pinned"] is True
    assert set(ids(api.get("/api/conversations/"))) == {old.pk, pinned.pk, archived.pk}
    assert ids(api.get("/api/conversations/", {"tag": "ideas"})) == []
    # A rename still works alone, and with the others at once.
    r = api.patch(f"/api/conversations/{old.pk}/", {"title": "new", "pinned": True},
                  format="json").json()
    assert r["title"] == "new" and r["pinned"] is True


@pytest.mark.parametrize("body, field", [
    ({}, "non_field_errors"),
    ({"pinned": "maybe"}, "pinned"),
    ({"archived": None}, "archived"),
    ({"tags": "work"}, "tags"),
    ({"tags": [""]}, "tags"),
    ({"tags": ["x" * 33]}, "tags"),
    ({"tags": [f"t{i}" for i in range(11)]}, "tags"),
    ({"tags": [7]}, "tags"),
    ({"tags": ["a\x00b"]}, "tags"),
])
def test_bad_organisation_is_a_400_naming_the_field(api, alice, body, field):
    conv = services.conversation_create(owner=alice, title="kept")
    r = api.patch(f"/api/conversations/{conv.pk}/", body, format="json")
    assert r.status_code == 400, r.content
    assert field in r.json()["errors"], r.json()
    conv.refresh_from_db()
    assert (conv.pinned, conv.archived, conv.tags.count()) == (False, False, 0)


def test_bad_filters_are_400s(api):
    assert api.get("/api/conversations/", {"archived": "sometimes"}).status_code == 400
    assert api.get("/api/conversations/", {"tag": "x" * 40}).status_code == 400
