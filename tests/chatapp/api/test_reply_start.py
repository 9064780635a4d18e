"""The conversations API starts a reply through replies.start, as the chat page does: with
the broker down the turn is kept, the reply fails clearly, the client gets a 503 and the
key's generation slot is given back."""

from __future__ import annotations

import pytest
from kombu.exceptions import OperationalError

from chatapp.accounting.ratelimit import limiter
from chatapp.api import services
from chatapp.api.models import ApiKey
from chatapp.chat import services as chat_services
from chatapp.chat.models import Message
from chatapp.generation import dispatch

# The view runs replies.start through async_to_sync, whose database calls run in another
# context: the rows must be committed (a test transaction would hide them, and Django
# closes a connection it finds inside one).
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker_down(monkeypatch, settings):
    from chatapp.celery import app

    def down(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    settings.API_MAX_CONCURRENT = 1
    limiter.reset()
    monkeypatch.setattr(dispatch, "use_worker", lambda **kwargs: True)
    monkeypatch.setattr(app, "send_task", down)


@pytest.mark.parametrize("stream", [False, True])
def test_with_the_broker_down_a_send_is_a_503_and_frees_its_slot(
    client, django_user_model, broker_down, stream
):
    user = django_user_model.objects.create_user("carol")
    auth = {"Authorization": f"Bearer {services.api_key_create(user=user)[1]}"}
    conversation = chat_services.conversation_create(owner=user)
    url = f"/api/conversations/{conversation.pk}/messages/"
    for _ in range(2):  # the second send finds its slot free again (at most 1 running)
        response = client.post(url, {"content": "Hi.", "stream": stream}, "application/json",
                               headers=auth)
        assert response.status_code == 503, response.content[:500]
        assert "saved" in response.json()["detail"]
    replies = Message.objects.filter(conversation=conversation, role=Message.Role.ASSISTANT)
    assert [r.status for r in replies] == [Message.Status.ERROR] * 2
    assert all(r.error == dispatch.UNAVAILABLE for r in replies)
    key = ApiKey.objects.get(user=user)
    assert limiter._running[key.pk] == 0
