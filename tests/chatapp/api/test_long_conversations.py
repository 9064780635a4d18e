"""Conversations longer than the context, over the APIs of a live server whose model holds
512 tokens: the conversations API cuts whole turns like the chat page and refuses, before
storing anything, a message that alone leaves no room; /v1 answers 400
context_length_exceeded unless asked for `truncation: "auto"`, which says what it left
out."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest

from tests.chatapp.api.conftest import MODEL, QUESTIONS, SHORT_CONTEXT, Accounts, question

pytestmark = pytest.mark.model

@pytest.fixture(scope="module")
def key(short_context_server) -> str:
    return Accounts(short_context_server).user_with_key()[1]


@pytest.fixture(scope="module")
def api(short_context_server, key):
    with httpx.Client(base_url=short_context_server.url, headers={"Authorization": f"Bearer {key}"},
                      timeout=300) as client:
        yield client


def test_the_conversations_api_cuts_whole_turns_and_refuses_what_cannot_fit(api):
    cid = api.post("/api/conversations/", json={"preset_id": "general"}).json()["id"]
    cuts = []
    for n in range(16):
        turn = api.post(f"/api/conversations/{cid}/messages/", json={"content": question(n)})
        assert turn.status_code == 201, turn.text
        reply = turn.json()["reply"]
        assert reply["status"] == "done" and reply["usage"]["prompt_tokens"] + 8 <= SHORT_CONTEXT
        cut = reply["usage"]["prefix_cache"].get("history_cut")
        if cut is not None and cut["new"]:
            cuts.append(cut)
            assert reply["usage"]["prefix_cache"]["diverged_segment"] == "history cut"
    assert cuts and all(c["messages"] == 2 * c["turns"] for c in cuts)

    before = api.get(f"/api/conversations/{cid}/messages/").json()["messages"]
    assert len(before) == 32  # nothing stored was deleted
    refused = api.post(f"/api/conversations/{cid}/messages/",
                       json={"content": "Explain this. " * 300})
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["code"] == "context_length_exceeded" and f"holds {SHORT_CONTEXT}" in body["detail"]
    assert api.get(f"/api/conversations/{cid}/messages/").json()["messages"] == before


def _history(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for n in range(turns):
        messages += [{"role": "user", "content": question(n)},
                     {"role": "assistant", "content": f"Answer {n + 1}: " + QUESTIONS[n % 4]}]
    return messages + [{"role": "user", "content": "And what did I ask first?"}]


def test_v1_refuses_a_long_history_unless_truncation_is_auto(api):
    messages = _history(12)
    refused = api.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and f"{SHORT_CONTEXT} tokens" in error["message"]

    done = api.post("/v1/chat/completions",
                    json={"model": MODEL, "messages": messages, "truncation": "auto"})
    assert done.status_code == 200, done.text
    body = done.json()
    cut = body["truncation"]
    # Whole turns (a user message and its reply), the system message kept.
    assert cut["type"] == "auto" and cut["messages_left_out"] == 2 * cut["turns_left_out"] > 0
    assert body["usage"]["prompt_tokens"] + 8 <= SHORT_CONTEXT
    assert body["choices"][0]["message"]["content"]

    # Streamed, the chunks say the same.
    with api.stream("POST", "/v1/chat/completions",
                    json={"model": MODEL, "messages": messages, "truncation": "auto",
                          "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {")]
    assert chunks and all(c["truncation"] == cut for c in chunks)

    # A history that fits is left whole, and says so.
    short = api.post("/v1/chat/completions",
                     json={"model": MODEL, "messages": _history(1), "truncation": "auto"})
    assert short.json()["truncation"]["messages_left_out"] == 0


def test_v1_truncation_names_a_last_message_that_alone_cannot_fit(api):
    messages = _history(2)
    messages[-1]["content"] = "Explain this. " * 300
    refused = api.post("/v1/chat/completions",
                       json={"model": MODEL, "messages": messages, "truncation": "auto"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"maximum context length is {SHORT_CONTEXT} tokens" in error["message"]

    bad = api.post("/v1/chat/completions",
                   json={"model": MODEL, "messages": _history(0), "truncation": "sometimes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncation"
