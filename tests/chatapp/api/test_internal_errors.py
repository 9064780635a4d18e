"""500s carry OpenAI's error object (on /v1/) or a plain detail (on /api/), never a
traceback. In-process: a live server cannot be made to fail on purpose."""

from __future__ import annotations

import pytest

from chatapp.accounting.ratelimit import limiter
from chatapp.api import services
from chatapp.api.v1 import completions
from tests.chatapp.api.conftest import MODEL


@pytest.fixture
def key(django_user_model, settings):
    settings.DEBUG = False
    limiter.reset()
    user = django_user_model.objects.create_user("erin")
    return services.api_key_create(user=user)[1]


@pytest.mark.django_db(transaction=True)
async def test_unexpected_failure_is_an_openai_500(async_client, key, monkeypatch):
    async def explode(**kwargs):
        raise RuntimeError("secret internals /srv/app.py line 42")

    monkeypatch.setattr(completions, "open_completion", explode)
    response = await async_client.post(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and set(error) == {"message", "type", "param", "code"}
    assert "secret internals" not in response.content.decode()
    assert "Traceback" not in response.content.decode()


@pytest.mark.django_db
def test_unexpected_failure_in_the_conversations_api(client, key, monkeypatch):
    from chatapp.api import conversations

    def explode(**kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(conversations, "conversation_queryset", explode)
    response = client.get("/api/conversations/", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 500
    assert response.json() == {"detail": "Internal server error.", "code": "server_error"}
