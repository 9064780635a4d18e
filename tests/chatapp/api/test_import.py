"""Importing ChatGPT's and Open WebUI's export files: branches kept as siblings, the
current leaf the source had, system/tool/empty nodes left out, a bad file refused whole
with a 400 naming what (nothing stored), the size bounds, and the owner's alone."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from chatapp.chat.models import Conversation, Message
from tests.chatapp.api.import_files import chatgpt_with_branch, open_webui_chat

pytestmark = pytest.mark.django_db

URL = "/api/conversations/import/"


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def upload(client: APIClient, data: object, name: str = "conversations.json"):
    raw = json.dumps(data).encode()
    return client.post(URL, {"file": SimpleUploadedFile(name, raw, "application/json")},
                       format="multipart")


def tree(conversation: Conversation) -> dict[str, list[str]]:
    """Each message's text -> its children's texts."""
    out = {}
    for m in Message.objects.filter(conversation=conversation).order_by("id"):
        out[m.content] = [c.content for c in m.children.order_by("id")]
    return out


def test_chatgpt_file_keeps_its_branch_and_current_node(alice):
    response = upload(client_for(alice), [chatgpt_with_branch()])
    assert response.status_code == 201, response.content
    (data,) = response.json()["conversations"]
    conversation = Conversation.objects.get(pk=data["id"], owner=alice)
    assert conversation.title == "Capitals"
    # The system and tool nodes are left out; the right answer hangs from its question.
    assert tree(conversation) == {
        "Capital of France?": ["Paris."],
        "Paris.": ["LEFT question", "RIGHT question"],
        "LEFT question": ["LEFT answer"], "LEFT answer": [],
        "RIGHT question": ["RIGHT answer"], "RIGHT answer": [],
    }
    assert conversation.current_leaf.content == "RIGHT answer"
    assert data["current_leaf_id"] == conversation.current_leaf_id
    roles = set(Message.objects.filter(conversation=conversation).values_list("role", flat=True))
    assert roles == {"user", "assistant"}
    # The messages API shows the branch as siblings, as an edit makes them.
    messages = client_for(alice).get(f"/api/conversations/{conversation.pk}/messages/").json()
    paris = next(m for m in messages["messages"] if m["content"] == "Paris.")
    assert len(paris["children_ids"]) == 2


def test_open_webui_file_as_a_json_body(alice):
    response = client_for(alice).post(URL, [open_webui_chat()], format="json")
    assert response.status_code == 201, response.content
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    assert conversation.title == "Greetings"
    assert tree(conversation) == {"Hello": ["Hi there.", "Hello! How can I help?"],
                                  "Hi there.": [], "Hello! How can I help?": []}
    assert conversation.current_leaf.content == "Hello! How can I help?"


def test_several_conversations_in_one_file(alice):
    response = upload(client_for(alice), [chatgpt_with_branch("One"), open_webui_chat("Two")])
    assert response.status_code == 201
    assert sorted(Conversation.objects.filter(owner=alice).values_list("title", flat=True)) == [
        "One", "Two"]


def refused(client: APIClient, data: object) -> str:
    before = (Conversation.objects.count(), Message.objects.count())
    response = upload(client, data)
    assert response.status_code == 400, response.content
    assert (Conversation.objects.count(), Message.objects.count()) == before
    return response.json()["detail"]


def test_a_bad_file_is_refused_naming_what_and_nothing_is_stored(alice):
    client = client_for(alice)
    good = chatgpt_with_branch("Good one")
    broken = chatgpt_with_branch("Broken one")
    broken["mapping"]["left"]["message"]["author"] = "user"
    detail = refused(client, [good, broken])
    assert "conversation 2" in detail and "Broken one" in detail and "message left" in detail

    webui = open_webui_chat("Webui")
    webui["chat"]["history"]["messages"]["r1"]["content"] = {"text": "?"}
    detail = refused(client, [webui])
    assert "Webui" in detail and "message r1" in detail and "not text" in detail

    detail = refused(client, [{"title": "what is this"}])
    assert "Conversation 1" in detail and "mapping" in detail

    only_system = chatgpt_with_branch("Empty")
    only_system["mapping"] = {"sys": {"message": {"author": {"role": "system"}, "content": {
        "content_type": "text", "parts": ["be nice"]}}, "parent": None, "children": []}}
    assert "no user or assistant message" in refused(client, [only_system])

    nul = open_webui_chat("Nul")
    nul["chat"]["history"]["messages"]["u1"]["content"] = "a\x00b"
    assert "message u1" in refused(client, [nul])


def test_a_file_that_is_not_json(alice):
    response = client_for(alice).post(
        URL, {"file": SimpleUploadedFile("c.json", b"{not json", "application/json")},
        format="multipart")
    assert response.status_code == 400
    assert "could not be read" in response.json()["detail"]
    assert not Conversation.objects.exists()


def test_the_size_bounds(alice, settings):
    client = client_for(alice)
    settings.CHAT_IMPORT_MAX_BYTES = 200
    response = upload(client, [chatgpt_with_branch()])
    assert response.status_code == 400
    assert "at most 200" in response.json()["detail"]

    settings.CHAT_IMPORT_MAX_BYTES = 1_000_000
    settings.CHAT_IMPORT_MAX_MESSAGES = 5
    response = upload(client, [chatgpt_with_branch()])  # 6 messages kept
    assert response.status_code == 400
    assert "6 messages" in response.json()["detail"]
    assert not Conversation.objects.exists()


def test_imported_conversations_are_the_importers_alone(alice, bob):
    response = upload(client_for(alice), [open_webui_chat()])
    conversation_id = response.json()["conversations"][0]["id"]
    as_bob = client_for(bob)
    for path in ("", "messages/", "export/", "export/markdown/"):
        assert as_bob.get(f"/api/conversations/{conversation_id}/{path}").status_code == 404
    assert not as_bob.get("/api/conversations/").json()["results"]
    assert APIClient().post(URL, [open_webui_chat()], format="json").status_code in (401, 403)
