"""Share links: one branch as it was when shared, readable without a login (unless
CHAT_SHARE_REQUIRES_LOGIN), no owner name unless chosen, revocable (404 afterwards), and
only the owner can make or revoke one."""

from __future__ import annotations

import pytest

from chatapp.chat import services
from chatapp.chat.models import ConversationShare, Message
from chatapp.generation import lifecycle
from tests.chatapp.api.conftest import api_as

pytestmark = pytest.mark.django_db


def finish(reply: Message, text: str) -> Message:
    return lifecycle.reply_finish(reply=reply, status=Message.Status.DONE, content=text,
                                  generated_token_ids=[3], segment_token_ids=[1, 3, 2],
                                  prompt_tokens=8, cached_tokens=0, ttft=0.1,
                                  finish_reason="stop")


@pytest.fixture
def branched(alice):
    """A conversation with two branches after its first reply: 'left' and 'right'."""
    conv = services.conversation_create(owner=alice, title="Capitals")
    _, first = services.message_send(conversation=conv, content="Capital of France?")
    first = finish(first, "Paris.")
    left_q, left = services.message_send(conversation=conv, content="LEFT question")
    left = finish(left, "LEFT answer")
    _, right = services.message_edit(conversation=conv, message_id=left_q.pk,
                                     content="RIGHT question")
    right = finish(right, "RIGHT answer")
    return conv, left, right


def test_a_share_shows_one_branch_as_it_was_then_until_revoked(client, alice, branched):
    conv, left, right = branched
    api = api_as(alice)
    r = api.post(f"/api/conversations/{conv.pk}/shares/", {"message_id": left.pk},
                 format="json")
    assert r.status_code == 201, r.content
    share = r.json()
    token = ConversationShare.objects.get().token
    assert len(token) >= 40 and share["url"].endswith(f"/s/{token}/")
    assert share["message_count"] == 4 and share["show_owner"] is False

    # Later messages on that branch do not show: the page is a snapshot.
    _, later = services.message_send(conversation=conv, content="LATER question",
                                     parent_id=left.pk)
    finish(later, "LATER answer")

    page = client.get(f"/s/{token}/")  # no login
    html = page.content.decode()
    assert page.status_code == 200
    assert "LEFT answer" in html and "Paris." in html
    assert "RIGHT" not in html and "LATER" not in html and "alice" not in html
    assert page["Referrer-Policy"] == "no-referrer"

    assert api.get(f"/api/conversations/{conv.pk}/shares/").json()[0]["id"] == share["id"]
    assert api.delete(f"/api/conversations/{conv.pk}/shares/{share['id']}/").status_code == 204
    assert client.get(f"/s/{token}/").status_code == 404
    assert api.get(f"/api/conversations/{conv.pk}/shares/").json() == []
    assert api.delete(f"/api/conversations/{conv.pk}/shares/{share['id']}/").status_code == 404


def test_owner_name_only_when_chosen_and_login_when_required(client, settings, alice, bob,
                                                             branched):
    conv, _, right = branched
    r = api_as(alice).post(f"/api/conversations/{conv.pk}/shares/",
                           {"show_owner": True}, format="json")
    token = ConversationShare.objects.get(pk=r.json()["id"]).token
    html = client.get(f"/s/{token}/").content.decode()
    assert "shared by alice" in html and "RIGHT answer" in html  # the current branch
    assert "LEFT" not in html

    settings.CHAT_SHARE_REQUIRES_LOGIN = True
    away = client.get(f"/s/{token}/")
    assert away.status_code == 302 and "/accounts/login/" in away["Location"]
    client.force_login(bob)  # any signed-in user may read it
    assert client.get(f"/s/{token}/").status_code == 200


def test_shares_of_another_users_conversation_are_missing(alice, bob, branched):
    conv, left, _ = branched
    mine = api_as(alice).post(f"/api/conversations/{conv.pk}/shares/", {},
                              format="json").json()
    as_bob = api_as(bob)
    assert as_bob.post(f"/api/conversations/{conv.pk}/shares/", {},
                       format="json").status_code == 404
    assert as_bob.get(f"/api/conversations/{conv.pk}/shares/").status_code == 404
    assert as_bob.delete(f"/api/conversations/{conv.pk}/shares/{mine['id']}/").status_code == 404
    # Bob's own conversation cannot share Alice's message either.
    own = services.conversation_create(owner=bob)
    r = as_bob.post(f"/api/conversations/{own.pk}/shares/", {"message_id": left.pk},
                    format="json")
    assert r.status_code == 404
    assert ConversationShare.objects.filter(revoked_at__isnull=True).count() == 1


@pytest.mark.parametrize("body", [{"message_id": "x"}, {"message_id": 0},
                                  {"show_owner": "perhaps"}])
def test_bad_share_input_is_a_400(alice, branched, body):
    conv, _, _ = branched
    r = api_as(alice).post(f"/api/conversations/{conv.pk}/shares/", body, format="json")
    assert r.status_code == 400 and not ConversationShare.objects.exists()


def test_an_empty_conversation_has_nothing_to_share(alice):
    conv = services.conversation_create(owner=alice)
    r = api_as(alice).post(f"/api/conversations/{conv.pk}/shares/", {}, format="json")
    assert r.status_code == 400 and "nothing to share" in r.json()["detail"]


def test_an_unknown_link_is_a_404(client):
    assert client.get("/s/not-a-real-token/").status_code == 404
