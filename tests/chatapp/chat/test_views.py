"""The chat page and its form endpoints over HTTP, including who may see what."""

import json
import re

import pytest
from django.urls import reverse

from chatapp.chat import services
from chatapp.chat.models import Conversation, Message
from chatapp.generation import lifecycle

pytestmark = pytest.mark.django_db


@pytest.fixture
def conv(alice):
    conv = services.conversation_create(owner=alice, title="Alice's plans")
    _, reply = services.message_send(conversation=conv, content="what's my plan?")
    lifecycle.reply_finish(reply=reply, status=Message.Status.DONE, content="**world** domination",
                          generated_token_ids=[3, 2], segment_token_ids=[1, 3, 2, 4],
                          prompt_tokens=48, cached_tokens=32, ttft=0.12, finish_reason="stop")
    return conv


def state(conv):
    return (list(Conversation.objects.filter(pk=conv.pk).values()),
            list(Message.objects.filter(conversation=conv).values()))


def test_pages_need_a_login(client, conv):
    for url in [reverse("chat:home"), reverse("chat:conversation", args=[conv.pk]),
                reverse("chat:messages", args=[conv.pk])]:
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_owner_sees_the_conversation_with_its_usage(client, alice, conv):
    client.force_login(alice)
    page = client.get(reverse("chat:conversation", args=[conv.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Alice&#x27;s plans" in html and 'id="initial-data"' in html
    data = client.get(reverse("chat:messages", args=[conv.pk])).json()
    reply = data["messages"][-1]
    assert reply["usage"] == {"prompt_tokens": 48, "cached_tokens": 32, "completion_tokens": 2,
                              "ttft_ms": 120.0}


def test_model_text_in_the_page_data_cannot_close_the_script_tag(client, alice, conv):
    reply = Message.objects.filter(conversation=conv, role="assistant").get()
    reply.content = "</script><script>alert(1)</script>"
    reply.save()
    client.force_login(alice)
    html = client.get(reverse("chat:conversation", args=[conv.pk])).content.decode()
    assert "<script>alert(1)" not in html
    start = html.index('id="initial-data"')
    blob = html[html.index(">", start) + 1: html.index("</script>", start)]
    assert json.loads(blob)["messages"][-1]["content"] == reply.content


def test_user_b_gets_404_for_everything_of_user_a(client, bob, conv):
    client.force_login(bob)
    before = state(conv)
    missing = conv.pk + 1000
    for name, method, data in [
        ("chat:conversation", "get", None),
        ("chat:messages", "get", None),
        ("chat:rename", "post", {"title": "pwned"}),
        ("chat:delete", "post", None),
    ]:
        theirs = getattr(client, method)(reverse(name, args=[conv.pk]), data)
        absent = getattr(client, method)(reverse(name, args=[missing]), data)
        assert theirs.status_code == absent.status_code == 404, name
    assert state(conv) == before
    home = client.get(reverse("chat:home"), {"q": "plans"}).content.decode()
    assert "Alice" not in home


def test_new_rename_delete_and_search(client, alice, conv):
    client.force_login(alice)
    created = client.post(reverse("chat:new"), {"preset_id": "coding"})
    new = Conversation.objects.exclude(pk=conv.pk).get()
    assert created.status_code == 302 and created["Location"].endswith(f"/c/{new.pk}/")
    assert new.preset_id == "coding" and new.preset_version

    client.post(reverse("chat:rename", args=[new.pk]), {"title": "  Kernel questions "})
    new.refresh_from_db()
    assert new.title == "Kernel questions"

    listing = client.get(reverse("chat:home"), {"q": "domination"}).content.decode()
    assert "Alice&#x27;s plans" in listing and "Kernel questions" not in listing

    deleted = client.post(reverse("chat:delete", args=[new.pk]))
    assert deleted.status_code == 302 and not Conversation.objects.filter(pk=new.pk).exists()


def test_bad_form_input_gets_a_clear_4xx(client, alice, conv):
    client.force_login(alice)
    before = state(conv)
    bad_title = client.post(reverse("chat:rename", args=[conv.pk]), {"title": "  "})
    assert bad_title.status_code == 400 and b"Title is empty" in bad_title.content
    bad_preset = client.post(reverse("chat:new"), {"preset_id": "nope"})
    assert bad_preset.status_code == 400 and b"Unknown preset" in bad_preset.content
    assert client.get(reverse("chat:delete", args=[conv.pk])).status_code == 405
    assert state(conv) == before


def test_sign_up_logs_in_and_can_be_switched_off(client, settings, django_user_model):
    response = client.post(reverse("signup"), {
        "username": "carol", "password1": "a-long-pass-phrase-1", "password2": "a-long-pass-phrase-1",
    })
    assert response.status_code == 302
    assert client.get(reverse("chat:home")).status_code == 200
    client.logout()
    mismatch = client.post(reverse("signup"), {
        "username": "dave", "password1": "a-long-pass-phrase-1", "password2": "other-pass-phrase-2",
    })
    assert mismatch.status_code == 400 and not django_user_model.objects.filter(username="dave")

    settings.CHAT_ALLOW_SIGNUP = False
    assert client.get(reverse("signup")).status_code == 404
    assert b"Sign up" not in client.get(reverse("login")).content


def test_the_page_loads_only_vendored_scripts_and_styles(client, alice, conv):
    # No CDN: everything the page loads comes from this server.
    from django.contrib.staticfiles import finders

    client.force_login(alice)
    html = client.get(reverse("chat:conversation", args=[conv.pk])).content.decode()
    refs = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert len(refs) >= 5 and not re.search(r'(?:src|href)="(?:https?:)?//', html)
    for ref in refs:
        assert finders.find(ref.removeprefix("/static/")), ref


def test_the_picker_shows_the_open_conversations_preset(client, alice, conv):
    client.force_login(alice)
    coding = services.conversation_create(owner=alice, preset_id="coding")
    selected = re.compile(r'<option value="([\w-]+)"\s+selected')
    html = client.get(reverse("chat:conversation", args=[coding.pk])).content.decode()
    assert selected.findall(html) == ["coding"]
    home = client.get(reverse("chat:home")).content.decode()
    assert selected.findall(home) == [conv.preset_id]  # the default on the start page


def test_the_list_fragment_filters_like_the_page(client, alice, bob, conv):
    client.force_login(alice)
    services.conversation_create(owner=alice, title="Kernel questions")
    url = reverse("chat:list")
    found = client.get(url, {"q": "domination"}).content.decode()
    assert "Alice&#x27;s plans" in found and "Kernel questions" not in found
    assert "<html" not in found  # the list items alone
    assert "No conversation matches" in client.get(url, {"q": "zzz"}).content.decode()
    client.force_login(bob)
    assert "Alice" not in client.get(url, {"q": ""}).content.decode()
    client.logout()
    assert client.get(url).status_code == 302


def test_the_favicon_is_linked_and_served(client, alice, conv):
    from django.contrib.staticfiles import finders

    client.force_login(alice)
    html = client.get(reverse("chat:home")).content.decode()
    icon = re.search(r'<link rel="icon" href="/static/([^"]+)"', html).group(1)
    assert finders.find(icon)
    redirect = client.get("/favicon.ico")
    assert redirect.status_code == 301 and redirect["Location"] == f"/static/{icon}"
