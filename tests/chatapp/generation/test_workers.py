"""Long generations on real Celery workers: streaming through Redis, a killed worker,
duplicate deliveries, cache-affinity routing, and a broker outage.

Every test here drives real `celery worker` processes (see conftest.py) against the
test's PostgreSQL database and Redis; they are skipped where those are not configured.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from channels_redis.core import RedisChannelLayer
from django_celery_results.models import TaskResult

from chatapp.chat import services
from chatapp.chat.models import Message
from tests.chatapp.generation.conftest import (
    WORKER_REDIS_DB,
    Cluster,
    _require_services,
    cluster_env,
    redis_client,
    redis_url_with_db,
    session_cookie,
    wait_for,
    ws_exchange,
)

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

LONG = "Write a long story about a dragon who learns to fly."


def done_for(reply_id: int | None = None):
    def until(events: list[dict]) -> bool:
        return any(e["type"] == "message.done" and (reply_id is None or e["message_id"] == reply_id)
                   for e in events)
    return until


def turn(cluster: Cluster, conversation, cookie: str, content: str) -> tuple[list[dict], Message]:
    """One turn over the chat socket of the cluster's web process; its stored reply."""
    url = f"{cluster.ws_url}/ws/chat/{conversation.pk}/"
    events = asyncio.run(ws_exchange(url, cookie, [{"type": "send", "content": content}],
                                     done_for()))
    done = [e for e in events if e["type"] == "message.done"][-1]
    return events, Message.objects.get(pk=done["message_id"])


def assert_one_complete_reply(reply: Message) -> None:
    assert reply.status == Message.Status.DONE, (reply.status, reply.error)
    assert reply.finish_reason in ("stop", "length")
    assert reply.generated_token_ids and reply.token_ids and reply.content
    assert reply.completion_tokens == len(reply.generated_token_ids)
    assert reply.prompt_tokens > 0 and reply.cached_tokens is not None
    siblings = Message.objects.filter(parent_id=reply.parent_id, role=Message.Role.ASSISTANT)
    assert list(siblings) == [reply]


def task_results(task_ids: list[str]) -> list[dict] | None:
    rows = TaskResult.objects.filter(task_id__in=task_ids, status="SUCCESS")
    if rows.count() < len(task_ids):
        return None
    return [json.loads(r.result) for r in rows]


def test_a_long_reply_is_generated_by_a_worker_and_streamed_through_redis(cluster, alice):
    conversation = services.conversation_create(owner=alice)
    events, reply = turn(cluster, conversation, session_cookie(alice), LONG)

    deltas = [e for e in events if e["type"] == "message.delta" and e["message_id"] == reply.pk]
    assert len(deltas) > 1
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
    done = events[-1]
    assert done["type"] == "message.done" and done["seq"] == len(deltas) + 1
    assert "".join(d["text"] for d in deltas) == done["message"]["content"] == reply.content
    assert_one_complete_reply(reply)
    assert reply.served_by in cluster.workers
    assert done["message"]["served_by"] == reply.served_by
    assert done["message"]["usage"]["completion_tokens"] == len(reply.generated_token_ids)
    # The web process never generated anything: it has no model loaded.
    assert "Loading model" not in (cluster.web_log.read_text())


def test_the_same_task_delivered_twice_yields_one_reply(cluster, alice):
    conversation = services.conversation_create(owner=alice)
    _, reply = services.message_send(conversation=conversation, content="Name three colours.")
    a, b = cluster.workers.values()
    # Both workers get the task at once: exactly one may generate.
    ids = [cluster.send_task(reply.pk, cluster.own_queue(a)),
           cluster.send_task(reply.pk, cluster.own_queue(b))]
    results = wait_for(lambda: task_results(ids), what="both deliveries")
    assert sorted(r["outcome"] for r in results) == ["finished", "generated"]
    reply.refresh_from_db()
    assert_one_complete_reply(reply)
    assert reply.served_by == [r for r in results if r["outcome"] == "generated"][0]["worker"]

    # A third delivery, after the end, changes nothing.
    before = (reply.updated_at, reply.generated_token_ids, reply.content)
    again = cluster.send_task(reply.pk, cluster.shared_queue)
    assert wait_for(lambda: task_results([again]))[0]["outcome"] == "finished"
    reply.refresh_from_db()
    assert (reply.updated_at, reply.generated_token_ids, reply.content) == before


def test_turns_stay_on_the_worker_that_holds_their_blocks_until_it_is_saturated(
    cluster, alice
):
    conversation = services.conversation_create(owner=alice)
    cookie = session_cookie(alice)
    _, first = turn(cluster, conversation, cookie, "Name a planet.")
    _, second = turn(cluster, conversation, cookie, "Name a star.")
    assert_one_complete_reply(first)
    assert_one_complete_reply(second)
    assert second.served_by == first.served_by
    # The whole first turn (its prompt and the reply's computed tokens) was a cache hit.
    first_turn = first.prompt_tokens + first.completion_tokens - 1
    assert second.cached_tokens >= (first_turn // 16) * 16 > first.prompt_tokens - 16

    preferred = cluster.workers[second.served_by]
    other = next(w for w in cluster.workers.values() if w is not preferred)
    queue = cluster.own_queue(preferred)
    # Saturate the preferred worker: it stops taking from its own queue, where two tasks
    # then wait (deliveries of a finished reply: harmless when they run).
    cluster.control("cancel_consumer", preferred, queue)
    try:
        for _ in range(2):
            cluster.send_task(first.pk, queue)
        redis = redis_client(cluster.broker_url)
        wait_for(lambda: redis.llen(queue) >= 2, what="the preferred worker's queue")
        _, third = turn(cluster, conversation, cookie, "Name a moon.")
    finally:
        cluster.control("add_consumer", preferred, queue)
    assert_one_complete_reply(third)
    assert third.served_by == other.name


def test_the_conversations_api_gets_a_worker_s_reply_and_its_stop_reaches_the_worker(
    cluster, alice
):
    import urllib.request

    from chatapp.api.services import api_key_create

    _, key = api_key_create(user=alice)
    conversation = services.conversation_create(owner=alice)
    base = f"{cluster.web_url}/api/conversations/{conversation.pk}/messages/"

    def post(url: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            url, data=json.dumps(body or {}).encode(), method="POST",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    # Not streamed: the answer comes when the worker has finished.
    turn_data = post(base, {"content": "Name a planet."})
    reply = Message.objects.get(pk=turn_data["reply"]["id"])
    assert turn_data["reply"]["status"] == "done" and turn_data["reply"]["content"]
    assert_one_complete_reply(reply)
    assert reply.served_by in cluster.workers

    # A long reply, stopped through the API while a worker generates it.
    _, long_reply = services.message_send(conversation=conversation, content=LONG)
    cluster.send_task(long_reply.pk, cluster.shared_queue)
    wait_for(lambda: Message.objects.get(pk=long_reply.pk).status == "streaming")
    post(f"{base}{long_reply.pk}/stop/")
    wait_for(lambda: not Message.objects.get(pk=long_reply.pk).is_active)
    long_reply.refresh_from_db()
    assert long_reply.status == Message.Status.STOPPED, long_reply.status
    assert len(long_reply.generated_token_ids) < 40


def test_stop_on_the_page_reaches_the_worker(cluster, alice):
    conversation = services.conversation_create(owner=alice)
    url = f"{cluster.ws_url}/ws/chat/{conversation.pk}/"
    cookie = session_cookie(alice)

    async def send_then_stop() -> list[dict]:
        from websockets.asyncio.client import connect

        headers = {"Cookie": f"sessionid={cookie}", "Origin": cluster.web_url}
        events: list[dict] = []
        async with connect(url, additional_headers=headers) as ws:
            await ws.recv()  # hello
            await ws.send(json.dumps({"type": "send", "content": LONG}))
            while not done_for()(events):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 120)))
                if events[-1]["type"] == "message.delta" and events[-1]["seq"] == 1:
                    await ws.send(json.dumps({"type": "stop"}))
        return events

    events = asyncio.run(send_then_stop())
    done = events[-1]["message"]
    assert not [e for e in events if e["type"] == "error"]
    reply = Message.objects.get(pk=done["id"])
    assert reply.status == Message.Status.STOPPED and reply.finish_reason == "abort"
    assert reply.served_by in cluster.workers
    # Stopped well before its 48 tokens, with the text so far kept.
    assert 0 < len(reply.generated_token_ids) < 40 and reply.content == done["content"]


async def start_and_wait_for_a_delta(cluster: Cluster, conversation, reply, queue: str) -> None:
    """Queue the reply's task on `queue` and return once its first delta streamed."""
    # As in settings: redis-py's 5 s read timeout equals BZPOPMIN's wait, so a first
    # delta slower than 5 s (a loaded host) would time the idle socket out.
    layer = RedisChannelLayer(hosts=[{"address": cluster.broker_url, "socket_timeout": 30}])
    channel = await layer.new_channel()
    await layer.group_add(conversation.group_name, channel)
    cluster.send_task(reply.pk, queue)
    while True:
        event = (await asyncio.wait_for(layer.receive(channel), 120))["event"]
        if event["type"] == "message.delta" and event["message_id"] == reply.pk:
            break
    await layer.group_discard(conversation.group_name, channel)


def persisted_mid_reply(reply: Message) -> Message:
    """Once the reply's heartbeat has stored some of its text (it is still streaming)."""
    return wait_for(lambda: Message.objects.filter(
        pk=reply.pk, status=Message.Status.STREAMING).exclude(content="").first(),
        what="a persisted partial reply")


def assert_interrupted_with_its_text(reply: Message, persisted: Message) -> None:
    reply.refresh_from_db()
    assert reply.status == Message.Status.INTERRUPTED, (reply.status, reply.error)
    assert reply.content.startswith(persisted.content) and reply.content
    n = len(persisted.generated_token_ids)
    assert reply.generated_token_ids[:n] == persisted.generated_token_ids
    assert reply.completion_tokens == len(reply.generated_token_ids) and reply.token_ids


def test_a_killed_pool_child_s_reply_is_interrupted_at_once_with_its_text(cluster, alice):
    """kill -9 of the pool child only: its worker requeues the task (reject on worker
    lost) and the new child, finding the reply's process dead, finishes it as interrupted
    with the text persisted so far."""
    conversation = services.conversation_create(owner=alice)
    _, reply = services.message_send(conversation=conversation, content=LONG)
    a = next(iter(cluster.workers.values()))
    asyncio.run(start_and_wait_for_a_delta(cluster, conversation, reply, cluster.own_queue(a)))
    persisted = persisted_mid_reply(reply)
    a.kill_pool_child()
    wait_for(lambda: not Message.objects.get(pk=reply.pk).is_active, timeout=60,
             what="the reply to be finished as interrupted")
    assert_interrupted_with_its_text(reply, persisted)
    cluster.wait_ready(a)


def test_a_reply_survives_kill_9_of_its_worker(cluster, alice):
    """Runs last of the cluster's tests: worker A does not come back. Its reply is
    finished as interrupted in seconds, keeping its text; Continue finishes it on B, and
    the next message continues its branch."""
    conversation = services.conversation_create(owner=alice)
    _, reply = services.message_send(conversation=conversation, content=LONG)
    a, b = cluster.workers.values()

    asyncio.run(start_and_wait_for_a_delta(cluster, conversation, reply, cluster.own_queue(a)))
    persisted = persisted_mid_reply(reply)
    a.kill()
    # CHAT_ORPHAN_S (5 s) plus a sweep (1 s), with room for two loaded cores.
    wait_for(lambda: not Message.objects.get(pk=reply.pk).is_active, timeout=20,
             what="the reply to be finished as interrupted")
    assert_interrupted_with_its_text(reply, persisted)
    interrupted = Message.objects.get(pk=reply.pk)

    url = f"{cluster.ws_url}/ws/chat/{conversation.pk}/"
    cookie = session_cookie(alice)
    asyncio.run(ws_exchange(url, cookie, [{"type": "continue", "message_id": reply.pk}],
                            done_for(reply.pk)))
    reply.refresh_from_db()
    assert reply.status == Message.Status.DONE and reply.served_by == b.name
    assert reply.content.startswith(interrupted.content)
    assert len(reply.generated_token_ids) > len(interrupted.generated_token_ids)

    events, next_reply = turn(cluster, conversation, cookie, "Thank you.")
    assert next_reply.parent.parent_id == reply.pk
    assert_one_complete_reply(next_reply)


def test_with_the_broker_down_a_message_is_refused_kept_and_retried_later(
    private_redis, alice
):
    _, redis_url = _require_services()
    layer_url = redis_url_with_db(redis_url, WORKER_REDIS_DB)
    shared = f"gen-test-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(env=cluster_env(private_redis.url, layer_url, shared),
                      broker_url=private_redis.url, shared_queue=shared)
    try:
        worker = cluster.start_worker("solo")
        cluster.start_web("broker-down")
        cluster.wait_ready(worker)
        conversation = services.conversation_create(owner=alice)
        url = f"{cluster.ws_url}/ws/chat/{conversation.pk}/"
        cookie = session_cookie(alice)

        private_redis.stop()
        events = asyncio.run(ws_exchange(
            url, cookie, [{"type": "send", "content": "Name a fruit."}],
            lambda evs: any(e["type"] == "error" for e in evs) and done_for()(evs),
        ))
        error = next(e for e in events if e["type"] == "error")
        assert error["code"] == "generation_unavailable"
        assert "saved" in error["message"]
        user_msg = Message.objects.get(conversation=conversation, role=Message.Role.USER)
        assert user_msg.content == "Name a fruit."
        failed = Message.objects.get(parent=user_msg)
        assert failed.status == Message.Status.ERROR and "unavailable" in failed.error

        private_redis.start()
        events = asyncio.run(ws_exchange(
            url, cookie, [{"type": "regenerate", "message_id": failed.pk}],
            lambda evs: any(e["type"] == "message.done" and e["message_id"] != failed.pk
                            for e in evs),
        ))
        assert not [e for e in events if e["type"] == "error"]
        retried = Message.objects.get(parent=user_msg, status=Message.Status.DONE)
        assert retried.served_by == worker.name and retried.generated_token_ids
        assert Message.objects.filter(conversation=conversation).count() == 3
    finally:
        cluster.stop()


# -- /v1 on the workers ------------------------------------------------------------------


def _v1(cluster: Cluster, key: str):
    import httpx2 as httpx

    return httpx.Client(base_url=f"{cluster.web_url}/v1", timeout=120,
                        headers={"Authorization": f"Bearer {key}"})


def _sse(response) -> list:
    data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def _affinity(cluster: Cluster) -> dict[str, str]:
    redis = redis_client(cluster.broker_url)
    prefix = f"prefixchat:affinity:{cluster.shared_queue}:"
    return {k.decode()[len(prefix):]: redis.get(k).decode()
            for k in redis.scan_iter(prefix + "*")}


def _completion_results() -> list[dict]:
    rows = TaskResult.objects.filter(result__contains='"finish_reasons"',
                                     status="SUCCESS").order_by("date_done")
    return [json.loads(r.result) for r in rows]


def test_v1_runs_on_a_worker_and_a_stateless_client_s_next_turn_lands_on_it(cluster, alice):
    from chatapp.api.services import api_key_create

    _, key = api_key_create(user=alice, max_concurrent=4)
    system = {"role": "system", "content": "You are a terse assistant. " * 12}
    with _v1(cluster, key) as v1:
        for question in ("Name a planet.", "Name a colour.", "Name a river."):
            before = _affinity(cluster)
            first = [system, {"role": "user", "content": question}]
            with v1.stream("POST", "/chat/completions", json={
                "model": "smollm2-135m-instruct", "messages": first, "max_tokens": 24,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            }) as response:
                assert response.status_code == 200, response.read()
                chunks = _sse(response)
            # Streamed back in order: the role first, text, the finish, usage last, [DONE].
            assert chunks[-1] == "[DONE]"
            usage_chunk, body = chunks[-2], chunks[:-2]
            assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
            assert body[0]["choices"][0]["delta"]["role"] == "assistant"
            assert body[-1]["choices"][0]["finish_reason"] in ("stop", "length")
            assert len({c["id"] for c in chunks[:-1]}) == 1
            reply = "".join(c["choices"][0]["delta"].get("content") or "" for c in body)
            turn1 = usage_chunk["usage"]

            # Which worker ran turn 1: it recorded the conversation's key.
            (conversation_key,) = set(_affinity(cluster)) - set(before)
            worker = _affinity(cluster)[conversation_key]
            assert worker in cluster.workers

            second = [*first, {"role": "assistant", "content": reply},
                      {"role": "user", "content": "And another one?"}]
            done = v1.post("/chat/completions", json={
                "model": "smollm2-135m-instruct", "messages": second, "max_tokens": 8,
                "temperature": 0,
            })
            assert done.status_code == 200, done.text
            turn2 = done.json()["usage"]
            # Turn 2 ran on the same worker, whose cache held turn 1 (prompt and reply, the
            # reply's ids spliced back) to whole blocks.
            assert _affinity(cluster)[conversation_key] == worker
            held = turn1["prompt_tokens"] + turn1["completion_tokens"] - 1
            assert turn2["prompt_tokens_details"]["cached_tokens"] >= held // 16 * 16, (turn1, turn2)


def test_a_tool_loop_on_a_worker_keeps_its_cache_with_re_serialised_arguments(
    cluster, alice
):
    """A required call runs under its schema on a worker; its next turn, the arguments sent
    back re-serialised, lands on the same worker and extends the first turn's prompt."""
    from chatapp.api.services import api_key_create

    _, key = api_key_create(user=alice)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}}}
    ask = [{"role": "user", "content": "What is the weather in Rome?"}]
    with _v1(cluster, key) as v1:
        first = v1.post("/chat/completions", json={
            "model": "smollm2-135m-instruct", "messages": ask, "tools": [tool],
            "tool_choice": "required", "temperature": 0, "max_tokens": 32})
        assert first.status_code == 200, first.text
        body = first.json()
        [call] = body["choices"][0]["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
        arguments = json.dumps(json.loads(call["function"]["arguments"]),
                               separators=(",", ":"), sort_keys=True)
        history = [*ask, {"role": "assistant", "content": None, "tool_calls": [
            {**call, "function": {**call["function"], "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "21 C"}]
        second = v1.post("/chat/completions", json={
            "model": "smollm2-135m-instruct", "messages": history, "tools": [tool],
            "temperature": 0, "max_tokens": 8})
        assert second.status_code == 200, second.text
    turn1, turn2 = body["usage"], second.json()["usage"]
    held = turn1["prompt_tokens"] + turn1["completion_tokens"]
    assert turn2["prompt_tokens_details"]["cached_tokens"] >= held // 16 * 16 - 16, (turn1, turn2)


def test_a_v1_client_that_leaves_aborts_its_generation_on_the_worker(cluster, alice):
    from chatapp.api.services import api_key_create

    _, key = api_key_create(user=alice)
    ran = len(_completion_results())
    with _v1(cluster, key) as v1, v1.stream("POST", "/chat/completions", json={
        "model": "smollm2-135m-instruct", "max_tokens": 1000, "temperature": 0,
        "messages": [{"role": "user", "content": LONG}], "stream": True,
    }) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                break  # the first text arrived: leave
    results = wait_for(lambda: _completion_results()[ran:], what="the worker's task result")
    assert results[-1]["finish_reasons"] == ["abort"], results
    assert results[-1]["outputs"] < 1000


def test_sampling_settings_reach_the_worker_and_its_logprobs_line_up(cluster, alice):
    """logit_bias (its token ids JSON keys on the way), penalties, top_k and min_tokens
    cross to the worker with the job; the logprobs it sends back make the content."""
    from chatapp.api.services import api_key_create
    from inference.loader import load_tokenizer

    [banana] = load_tokenizer().encode(" banana", add_special_tokens=False)
    _, key = api_key_create(user=alice, max_concurrent=4)
    before = _affinity(cluster)
    with _v1(cluster, key) as v1:
        done = v1.post("/chat/completions", json={
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "Name a fruit."}],
            "max_tokens": 4, "min_tokens": 4, "temperature": 0, "top_k": 5,
            "frequency_penalty": 0.1, "logit_bias": {str(banana): 100}, "logprobs": True,
        })
    assert done.status_code == 200, done.text
    assert set(_affinity(cluster)) - set(before)  # a worker ran it
    choice = done.json()["choices"][0]
    assert choice["message"]["content"] == " banana" * 4
    joined = b"".join(bytes(t["bytes"]) for t in choice["logprobs"]["content"])
    assert joined == (" banana" * 4).encode()


def test_a_text_completion_runs_on_a_worker_with_its_prompt_s_logprobs(cluster, alice):
    """/v1/completions takes the same path: the worker scores the prompt during its
    prefill and the logprobs come back through Redis, one per prompt token."""
    from chatapp.api.services import api_key_create
    from inference.loader import load_tokenizer

    prompt = "The three primary colours are"
    ids = load_tokenizer().encode(prompt)
    _, key = api_key_create(user=alice, max_concurrent=4)
    before = _affinity(cluster)
    with _v1(cluster, key) as v1:
        done = v1.post("/completions", json={
            "model": "smollm2-135m-instruct", "prompt": [prompt, ids], "max_tokens": 4,
            "temperature": 0, "echo": True, "logprobs": 1})
    assert done.status_code == 200, done.text
    assert set(_affinity(cluster)) - set(before)  # a worker ran it
    first, second = done.json()["choices"]
    assert first["text"] == second["text"] and first["text"].startswith(prompt)
    logprobs = first["logprobs"]
    assert logprobs["token_logprobs"][0] is None
    assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    assert "".join(logprobs["tokens"]) == first["text"]
    assert len(logprobs["tokens"]) == len(ids) + done.json()["usage"]["completion_tokens"] // 2
