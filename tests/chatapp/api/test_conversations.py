"""The conversations API end to end: create, list/filter/paginate, rename, send (JSON and
SSE), the message tree, stop, export, delete."""

from __future__ import annotations

import json
import time

import httpx2 as httpx
import pytest

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def api(api_server, accounts):
    _, key = accounts.user_with_key()
    with httpx.Client(base_url=api_server.url + "/api",
                      headers={"Authorization": f"Bearer {key}"}, timeout=300) as client:
        yield client


def _sse_events(response) -> list[tuple[str, dict]]:
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: "):])))
    return events


def test_conversation_lifecycle(api):
    made = api.post("/conversations/", json={"title": "Colours", "preset_id": "general"})
    assert made.status_code == 201, made.text
    conv = made.json()
    assert conv["title"] == "Colours" and conv["preset_version"]
    cid = conv["id"]

    # A reply as JSON, when it is complete.
    turn = api.post(f"/conversations/{cid}/messages/", json={"content": "Name a colour."})
    assert turn.status_code == 201, turn.text
    user_msg, reply = turn.json()["user_message"], turn.json()["reply"]
    assert reply["parent_id"] == user_msg["id"] and reply["status"] == "done"
    assert reply["content"] and reply["usage"]["completion_tokens"] >= 1
    assert reply["token_count"] > reply["usage"]["completion_tokens"]  # markers included

    # The next reply streamed as server-sent events; its prompt extends the first one.
    with api.stream("POST", f"/conversations/{cid}/messages/",
                    json={"content": "Another one?", "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(response)
    names = [n for n, _ in events]
    assert names[0] == "message.created" and names[1] == "message.started"
    assert names[-1] == "message.done" and "message.delta" in names
    deltas = [e for n, e in events if n == "message.delta"]
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
    final = events[-1][1]["message"]
    assert final["content"] == "".join(d["text"] for d in deltas)
    assert final["usage"]["cached_tokens"] >= 16 * (reply["usage"]["prompt_tokens"] // 16)

    # Regenerating is the chat page's; here a second answer to the first question is a
    # sibling branch: send after the first user message's parent (none) is not allowed,
    # so branch from the first reply instead.
    branch = api.post(f"/conversations/{cid}/messages/",
                      json={"content": "Why?", "parent_id": reply["id"]})
    assert branch.status_code == 201

    tree = api.get(f"/conversations/{cid}/messages/").json()
    by_id = {m["id"]: m for m in tree["messages"]}
    assert tree["root_ids"] == [user_msg["id"]]
    assert len(by_id[reply["id"]]["children_ids"]) == 2  # two branches after the first reply
    assert tree["current_leaf_id"] == branch.json()["reply"]["id"]
    for m in tree["messages"]:
        assert all(by_id[c]["parent_id"] == m["id"] for c in m["children_ids"])

    one = api.get(f"/conversations/{cid}/messages/{reply['id']}/").json()
    assert one["content"] == reply["content"]
    stopped = api.post(f"/conversations/{cid}/messages/{reply['id']}/stop/")
    assert stopped.status_code == 202 and stopped.json()["status"] == "done"  # already done

    export = api.get(f"/conversations/{cid}/export/").json()
    assert len(export["messages"]) == 6
    assert export["usage"]["replies"] == 3
    assert export["usage"]["completion_tokens"] == sum(
        m["completion_tokens"] or 0 for m in export["messages"])
    assert export["current_branch_ids"][-1] == tree["current_leaf_id"]
    first = next(m for m in export["messages"] if m["id"] == reply["id"])
    assert first["generated_token_count"] == first["completion_tokens"]

    markdown = api.get(f"/conversations/{cid}/export/markdown/")
    assert markdown.headers["content-type"].startswith("text/markdown")
    assert markdown.text.startswith("# Colours")
    assert "## User" in markdown.text and "Why?" in markdown.text
    assert "Another one?" not in markdown.text  # other branch

    renamed = api.patch(f"/conversations/{cid}/", json={"title": "Hues"})
    assert renamed.json()["title"] == "Hues"
    assert api.delete(f"/conversations/{cid}/").status_code == 204
    assert api.get(f"/conversations/{cid}/").status_code == 404


def test_list_filter_and_paginate(api):
    for title in ("alpha one", "beta two", "alpha three"):
        assert api.post("/conversations/", json={"title": title}).status_code == 201
    page = api.get("/conversations/", params={"search": "alpha", "ordering": "title"}).json()
    assert [c["title"] for c in page["results"]] == ["alpha one", "alpha three"]
    assert page["count"] == 2
    first = api.get("/conversations/", params={"page_size": 1, "ordering": "title"}).json()
    assert len(first["results"]) == 1 and first["next"]
    assert api.get("/conversations/", params={"preset_id": "nope"}).json()["count"] == 0
    bad = api.get("/conversations/", params={"ordering": "password"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid"
    assert api.get("/conversations/", params={"page": 999}).status_code == 404


def test_bad_input(api):
    assert api.post("/conversations/", json={"preset_id": "no-such"}).status_code == 400
    cid = api.post("/conversations/", json={}).json()["id"]
    for body in ({}, {"content": ""}, {"content": "   "}, {"content": 5},
                 {"content": "x" * 16001}, {"content": "hi", "stream": "maybe"}):
        response = api.post(f"/conversations/{cid}/messages/", json=body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["detail"]
    assert api.patch(f"/conversations/{cid}/", json={"title": ""}).status_code == 400
    broken = api.post("/conversations/", content=b"{oops",
                      headers={"Content-Type": "application/json"})
    assert broken.status_code == 400


def test_continue_generates_more_of_a_reply_cut_at_its_length_limit(api):
    cid = api.post("/conversations/", json={"title": "Count"}).json()["id"]
    turn = api.post(f"/conversations/{cid}/messages/",
                    json={"content": "Count from one to fifty in words."}).json()
    reply = turn["reply"]
    assert reply["finish_reason"] == "length" and reply["can_continue"]  # 8 tokens a reply

    more = api.post(f"/conversations/{cid}/messages/{reply['id']}/continue/")
    assert more.status_code == 200, more.text
    longer = more.json()
    assert longer["id"] == reply["id"] and longer["content"].startswith(reply["content"])
    assert longer["usage"]["completion_tokens"] > reply["usage"]["completion_tokens"]
    # Its prompt was the first one plus the reply's ids, served by the cache.
    assert longer["usage"]["prompt_tokens"] == (
        reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"])
    assert longer["usage"]["cached_tokens"] >= 16 * (reply["usage"]["prompt_tokens"] // 16)

    with api.stream("POST", f"/conversations/{cid}/messages/{reply['id']}/continue/",
                    json={"stream": True}) as response:
        events = _sse_events(response)
    started = next(e for n, e in events if n == "message.started")
    assert started["text"] == longer["content"]
    assert events[-1][1]["message"]["content"].startswith(longer["content"])

    # A reply that ended on its own, or one with a reply after it, is not continued.
    api.post(f"/conversations/{cid}/messages/", json={"content": "Thanks."})
    refused = api.post(f"/conversations/{cid}/messages/{reply['id']}/continue/")
    assert refused.status_code == 400 and "last reply" in refused.text


def test_a_streamed_reply_whose_client_leaves_goes_on_to_its_end(api):
    """Leaving the stream is not Stop: the reply is generated to its end and stored whole,
    as a closed chat page's is."""
    cid = api.post("/conversations/", json={"preset_id": "general"}).json()["id"]
    with api.stream("POST", f"/conversations/{cid}/messages/",
                    json={"content": "Count from 1 to 40.", "stream": True}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        reply_id = json.loads(first[len("data: "):])["reply"]["id"]
        next(line for line in lines if line.startswith("event: message.delta"))
    # The connection is closed here, mid-reply.
    for _ in range(600):
        reply = api.get(f"/conversations/{cid}/messages/{reply_id}/").json()
        if reply["status"] not in ("pending", "streaming"):
            break
        time.sleep(0.5)
    assert reply["status"] == "done", reply
    assert reply["content"] and reply["usage"]["completion_tokens"] >= 1
