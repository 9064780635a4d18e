"""A conversation's settings and personal presets over the conversations API, in process
(no reply is generated): who may see what, what input is refused, the locked setting,
starting a chat on a preset, and the settings in the conversation, its export and the
OpenAPI schema."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from chatapp.chat import services
from chatapp.chat.models import Conversation, UserPreset
from tests.chatapp.api.conftest import api_as

pytestmark = pytest.mark.django_db

TEXT = "You are a patient tutor. Explain one step at a time."


@pytest.fixture
def api(alice):
    return api_as(alice)


@pytest.fixture
def conv(alice):
    return services.conversation_create(owner=alice)


def settings_url(conv) -> str:
    return f"/api/conversations/{conv.pk}/settings/"


def test_settings_are_read_changed_and_shown_on_the_conversation(api, conv, settings):
    settings.CHAT_MAX_NEW_TOKENS = 64
    got = api.get(settings_url(conv)).json()
    assert got["system_prompt"] == "" and got["temperature"] is None and got["user_preset_id"] is None
    changed = api.patch(settings_url(conv), {"system_prompt": TEXT, "temperature": 0.2,
                                             "top_p": 0.9, "max_new_tokens": 64}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["system_prompt"] == TEXT and changed.json()["max_new_tokens"] == 64
    detail = api.get(f"/api/conversations/{conv.pk}/").json()
    assert (detail["system_prompt"], detail["temperature"], detail["top_p"]) == (TEXT, 0.2, 0.9)
    exported = api.get(f"/api/conversations/{conv.pk}/export/").json()
    assert exported["conversation"]["system_prompt"] == TEXT
    markdown = api.get(f"/api/conversations/{conv.pk}/export/markdown/").content.decode()
    assert "## System prompt" in markdown and TEXT in markdown
    # null goes back to the server's value.
    back = api.patch(settings_url(conv), {"temperature": None}, format="json").json()
    assert back["temperature"] is None and back["top_p"] == 0.9


@pytest.mark.parametrize("body, field", [
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_new_tokens": 100000}, "max_new_tokens"),
    ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"system_prompt": "Today is {{CURRENT_DATE}}."}, "system_prompt"),
    ({"system_prompt": "x" * 9000}, "system_prompt"),
    ({"system_prompt": 42}, "system_prompt"),
    ({"model": "no-such-model"}, "model"),
    ({"colour": "blue"}, "colour"),
])
def test_bad_settings_are_400s_naming_the_field(api, conv, body, field):
    response = api.patch(settings_url(conv), body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert Conversation.objects.get(pk=conv.pk).system_prompt == ""


def test_personal_presets_are_created_listed_changed_and_deleted(api):
    made = api.post("/api/user-presets/", {"name": "Tutor", "system_prompt": TEXT,
                                           "temperature": 0.3}, format="json")
    assert made.status_code == 201, made.content
    pid = made.json()["id"]
    assert [p["name"] for p in api.get("/api/user-presets/").json()] == ["Tutor"]
    same = api.post("/api/user-presets/", {"name": "Tutor"}, format="json")
    assert same.status_code == 400 and "already have" in same.json()["detail"]
    assert api.post("/api/user-presets/", {"system_prompt": TEXT}, format="json").status_code == 400
    renamed = api.patch(f"/api/user-presets/{pid}/", {"name": "Teacher", "top_p": 0.8},
                        format="json")
    assert renamed.json()["name"] == "Teacher" and renamed.json()["temperature"] == 0.3
    assert api.delete(f"/api/user-presets/{pid}/").status_code == 204
    assert api.get(f"/api/user-presets/{pid}/").status_code == 404


def test_a_chat_starts_on_a_personal_preset_and_keeps_its_copy(api):
    pid = api.post("/api/user-presets/", {"name": "Tutor", "system_prompt": TEXT,
                                          "temperature": 0.0}, format="json").json()["id"]
    made = api.post("/api/conversations/", {"user_preset_id": pid}, format="json")
    assert made.status_code == 201, made.content
    conv = made.json()
    assert conv["system_prompt"] == TEXT and conv["temperature"] == 0.0
    assert conv["user_preset_id"] == pid
    api.patch(f"/api/user-presets/{pid}/", {"system_prompt": "Something else."}, format="json")
    assert api.get(f"/api/conversations/{conv['id']}/").json()["system_prompt"] == TEXT
    # Settings can also be given at creation.
    own = api.post("/api/conversations/", {"system_prompt": TEXT, "top_p": 0.5}, format="json")
    assert own.status_code == 201 and own.json()["top_p"] == 0.5
    bad = api.post("/api/conversations/", {"temperature": -1}, format="json")
    assert bad.status_code == 400 and "temperature" in bad.json()["errors"]


def test_other_users_conversations_and_presets_look_missing(alice, bob, conv):
    alice_preset = UserPreset.objects.create(owner=alice, name="Mine", system_prompt=TEXT)
    as_bob = api_as(bob)
    assert as_bob.get(settings_url(conv)).status_code == 404
    assert as_bob.patch(settings_url(conv), {"temperature": 1}, format="json").status_code == 404
    for method in ("get", "patch", "delete"):
        response = getattr(as_bob, method)(f"/api/user-presets/{alice_preset.pk}/", {},
                                           format="json")
        assert response.status_code == 404, method
    assert as_bob.get("/api/user-presets/").json() == []
    # Nor can bob start a chat on alice's preset or give it to his own chat.
    start = as_bob.post("/api/conversations/", {"user_preset_id": alice_preset.pk},
                        format="json")
    assert start.status_code == 404
    bobs = services.conversation_create(owner=bob)
    given = as_bob.patch(settings_url(bobs), {"user_preset_id": alice_preset.pk}, format="json")
    assert given.status_code == 404
    assert UserPreset.objects.get(pk=alice_preset.pk).system_prompt == TEXT
    assert Conversation.objects.get(pk=conv.pk).temperature is None
    assert APIClient().get("/api/user-presets/").status_code in (401, 403)


def test_a_locked_server_offers_only_its_own_presets(api, conv, settings):
    settings.CHAT_LOCK_PRESETS = True
    refused = api.patch(settings_url(conv), {"system_prompt": TEXT}, format="json")
    assert refused.status_code == 400 and "only its own presets" in str(refused.json())
    saved = api.post("/api/user-presets/", {"name": "x"}, format="json")
    assert saved.status_code == 400 and saved.json()["code"] == "presets_locked"
    # Sampling is still the user's to choose.
    assert api.patch(settings_url(conv), {"temperature": 0.1}, format="json").status_code == 200


def test_the_schema_documents_the_new_endpoints(api):
    schema = api.get("/api/schema/?format=json").json()
    assert "/api/user-presets/{preset_id}/" in schema["paths"]
    assert "patch" in schema["paths"]["/api/conversations/{conversation_id}/settings/"]
