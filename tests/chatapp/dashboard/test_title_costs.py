"""The dashboard says what the titles the model writes cost, in tokens."""

from __future__ import annotations

import pytest

from chatapp.chat import services
from chatapp.chat.models import GeneratedTitle, Message

pytestmark = pytest.mark.django_db


def titled(owner, n: int, **figures) -> GeneratedTitle:
    conversation = services.conversation_create(owner=owner)
    user = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                  content=f"question {n}")
    reply = Message.objects.create(conversation=conversation, parent=user,
                                   role=Message.Role.ASSISTANT, content="answer")
    return GeneratedTitle.objects.create(conversation=conversation, reply=reply, **figures)


def test_the_dashboard_shows_the_titles_cost_in_tokens(staff_client, member):
    page = staff_client.get("/admin/cache/").content.decode()
    assert 'id="titles"' in page and "No titles yet" in page
    titled(member, 1, status=GeneratedTitle.Status.READY, text="Cache talk",
           prompt_tokens=120, cached_tokens=112, completion_tokens=6)
    titled(member, 2, status=GeneratedTitle.Status.DROPPED, text="Other",
           prompt_tokens=90, cached_tokens=80, completion_tokens=4)
    titled(member, 3, status=GeneratedTitle.Status.PENDING)
    page = staff_client.get("/admin/cache/").content.decode()
    section = page[page.index('id="titles"'):]
    cells = ["<td>3</td>", "<td>1</td>", "<td>210</td>", "<td>192</td>", "<td>18</td>",
             "<td>10</td>", "9.0 computed + 5.0 written"]
    for cell in cells:
        assert cell in section, cell
