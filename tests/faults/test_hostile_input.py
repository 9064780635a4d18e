"""Hostile input on a live server: a generated corpus of bodies and frames.

Every field of /v1/chat/completions, POST /api/conversations/ and
POST /api/conversations/<id>/messages/ gets every value of a list of wrong types and
extremes, and each endpoint gets the structural attacks (deep nesting, truncation, bad
UTF-8, NaN, repeated keys, huge strings and numbers, empty bodies, other content types);
the chat WebSocket gets the same as frames. Expected: no 5xx (nor a server_error inside
a stream), every refusal in the endpoint's error shape and short, no closed socket (each
frame is answered by an `error` event, and a ping after it by a pong), no traceback in
the server's log, and normal requests served afterwards.

Bodies that pass validation must not start long generations: /v1 asks for one token,
and message bodies always name a parent that does not exist (a 404 before generating).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import httpx2 as httpx
import pytest
from websockets.asyncio.client import connect

from tests.chatapp.e2e.conftest import PYTHON, ROOT
from tests.faults.apikeys import MODEL

pytestmark = pytest.mark.model

NO_SUCH_ID = 987_654_321
ERROR_BODY_MAX = 4096  # refusals quote client input only briefly
TIMEOUT = 120  # bounds a hung request only


def _nested(depth: int, leaf: object = 1) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


# Wrong types and extremes, substituted into every field in turn.
VALUES: list[object] = [
    None, True, False, 0, 1, -1, 2**31, 2**63, -(2**63) - 1, 10**30, 1.5, -0.0, 1e308,
    5e-324, "", "   ", "1", "null", "x" * 100_000, "a\u0000b", "\ud800", "😀" * 1000,
    "<script>alert(1)</script>", [], [None], [1, "a", {}], ["x"] * 1000, {}, {"a": 1},
    {"": None}, _nested(20),
]


@dataclass
class Case:
    name: str
    body: bytes
    content_type: str | None = "application/json"


def _dump(doc: object) -> bytes:
    # allow_nan: the corpus itself carries NaN/Infinity where asked; ensure_ascii keeps
    # lone surrogates as escapes (valid JSON text).
    return json.dumps(doc).encode()


def _field_cases(base: dict, fields: dict[str, object], skip=lambda path, v: False):
    """`base` with each field (a dotted path, list indices as digits) set to each value."""
    for path in fields:
        for i, value in enumerate(VALUES):
            if skip(path, value):
                continue
            doc = json.loads(json.dumps(base))
            *parents, last = path.split(".")
            node = doc
            for part in parents:
                node = node[int(part)] if part.isdigit() else node[part]
            node[int(last) if last.isdigit() else last] = value
            yield Case(f"{path}={i}", _dump(doc))


def _structural_cases(valid: dict, rng: random.Random) -> Iterator[Case]:
    """Attacks on the document itself, around a valid body of the endpoint."""
    good = _dump(valid)
    for depth in (33, 1_000, 100_000):
        yield Case(f"deep-array-{depth}", b"[" * depth + b"]" * depth)
        yield Case(f"deep-object-{depth}", b'{"a":' * depth + b"1" + b"}" * depth)
    yield Case("deep-unclosed", b"[" * 100_000)
    yield Case("deep-in-a-field", good[:-1] + b', "x": ' + b"[" * 40 + b"]" * 40 + b"}")
    for cut in sorted(rng.sample(range(1, len(good)), min(8, len(good) - 1))):
        yield Case(f"truncated-{cut}", good[:cut])
    for i in range(4):
        at = rng.randrange(len(good))
        yield Case(f"bad-utf8-{i}", good[:at] + bytes([0xC3, 0x28, 0xFF]) + good[at:])
    yield Case("utf16", json.dumps(valid).encode("utf-16"))
    yield Case("bom", b"\xef\xbb\xbf" + good)
    for constant in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9" * 5000):
        yield Case(f"number-{constant[:8].decode()}", good[:-1] + b', "n": ' + constant + b"}")
    key = next(iter(valid))
    yield Case("duplicate-key", good[:-1] + b", " + _dump({key: valid[key]})[1:])
    yield Case("duplicate-key-other-value", good[:-1] + f', "{key}": 42}}'.encode())
    for raw in (b"", b"   ", b"null", b"[]", b'"text"', b"123", b"true", b"{}", b"{}x",
                b"{}{}", b"[1,]", b"{'a': 1}", b'{"a": "\x01\x02"}', b"\x00" * 64):
        yield Case(f"raw-{raw[:10]!r}", raw)
    yield Case("huge-string", good[:-1] + b', "pad": "' + b"x" * 1_000_000 + b'"}')
    yield Case("over-the-size-limit", good[:-1] + b', "pad": "' + b"x" * 3_000_000 + b'"}')
    yield Case("long-key", good[:-1] + b', "' + b"k" * 100_000 + b'": 1}')
    yield Case("many-keys", _dump({**valid, **{f"k{i}": i for i in range(20_000)}}))
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data", "multipart/form-data; boundary=zz",
                         "application/xml", "application/json; charset=latin-1",
                         "application/json; charset=utf-16"):
        yield Case(f"content-type-{content_type}", good, content_type)
    multipart = (b"--zz\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
                 + MODEL.encode() + b"\r\n--zz--\r\n")
    yield Case("multipart-form", multipart, "multipart/form-data; boundary=zz")


V1_BASE = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
           "max_tokens": 1, "max_completion_tokens": 1}
V1_FIELDS = [
    "model", "messages", "messages.0", "messages.0.role", "messages.0.content", "stream",
    "stream_options", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
    "stop", "seed", "user", "cache_salt", "prefix_cache_receipt", "tools",
    "response_format", "logprobs", "logit_bias",
]


def v1_cases(rng) -> list[Case]:
    # max_completion_tokens wins over max_tokens: with it fuzzed, a valid value still
    # asks for one token at most... unless it is a large one, then the context is exceeded.
    base = dict(V1_BASE)
    cases = list(_field_cases(base, dict.fromkeys(V1_FIELDS)))
    parts = {**base, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    cases += _field_cases(parts, dict.fromkeys(["messages.0.content.0",
                                                "messages.0.content.0.text"]))
    streaming = {**base, "stream": True, "stream_options": {"include_usage": True}}
    cases += _field_cases(streaming, dict.fromkeys(["stream_options.include_usage"]))
    return cases + list(_structural_cases(base, rng))


CONVERSATION_BASE = {"title": "t", "variables": {"name": "v"}}


def conversation_cases(rng) -> list[Case]:
    fields = dict.fromkeys(["title", "preset_id", "preset_version", "variables",
                            "variables.name"])
    return list(_field_cases(CONVERSATION_BASE, fields)) + list(
        _structural_cases(CONVERSATION_BASE, rng))


# The parent never exists: a valid body is a 404, never a generation.
MESSAGE_BASE = {"content": "Hi", "parent_id": NO_SUCH_ID}


def message_cases(rng) -> list[Case]:
    return list(_field_cases(
        MESSAGE_BASE, dict.fromkeys(["content", "parent_id", "stream"]),
        skip=lambda path, v: path == "parent_id" and v is None,
    )) + list(_structural_cases(MESSAGE_BASE, rng))


def frame_cases(rng) -> list[Case]:
    """WebSocket frames: every event's fields fuzzed (ids that exist nowhere, so nothing
    generates), the structural attacks, and the event type itself."""
    events = {
        "send": ({"type": "send", "content": "Hi", "parent_id": NO_SUCH_ID},
                 ["content", "parent_id"]),
        "edit": ({"type": "edit", "message_id": NO_SUCH_ID, "content": "Hi"},
                 ["message_id", "content"]),
        "regenerate": ({"type": "regenerate", "message_id": NO_SUCH_ID}, ["message_id"]),
        "stop": ({"type": "stop", "message_id": NO_SUCH_ID}, ["message_id"]),
        "select": ({"type": "select", "message_id": NO_SUCH_ID}, ["message_id"]),
    }
    cases: list[Case] = []
    for kind, (base, fields) in events.items():
        cases += _field_cases(
            base, dict.fromkeys(fields),
            # A null parent sends for real; a null id stops every (no) running reply.
            skip=lambda path, v, kind=kind: v is None and path in ("parent_id", "message_id")
            and kind in ("send", "stop"),
        )
    cases += _field_cases({"type": "ping"}, {"type": None})
    # Content types mean nothing to a socket; empty frames cannot be sent; over 1 MiB,
    # daphne itself closes the socket (1009, "message too big"), as WebSocket servers do.
    return cases + [c for c in _structural_cases(events["send"][0], rng)
                    if c.content_type == "application/json" and 0 < len(c.body) <= 2**20]


# --- the server side: accounts and the log ---------------------------------------------


@pytest.fixture(scope="module")
def account(fault_server) -> dict:
    """A user with a session, an empty conversation and a key with room for the corpus."""
    out = subprocess.run(
        [PYTHON, str(ROOT / "tests/chatapp/api/seed.py"), "hostile-",
         json.dumps([{"rpm": 1_000_000, "concurrent": 8}])],
        env=fault_server.env, cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])[0]


@pytest.fixture(scope="module")
def server_log(fault_server):
    """The server's log from this module's start: read() gives what it wrote since."""
    start = fault_server.log.stat().st_size

    class Log:
        @staticmethod
        def read() -> str:
            with open(fault_server.log, "rb") as f:
                f.seek(start)
                return f.read().decode("utf-8", "replace")

    return Log


def _problem(case: Case, response: httpx.Response, error_key: str) -> str | None:
    """What is wrong with the server's answer to `case`, or None."""
    status, body = response.status_code, response.content
    if status >= 500:
        return f"{case.name}: {status} {body[:200]!r}"
    if b'"server_error"' in body:  # a stream that failed after its 200
        return f"{case.name}: server_error in {body[:200]!r}"
    if status >= 400:
        if not response.headers.get("content-type", "").startswith("application/json"):
            return f"{case.name}: {status} is not JSON: {body[:200]!r}"
        if error_key not in response.json():
            return f"{case.name}: {status} has no {error_key!r}: {body[:200]!r}"
        if len(body) > ERROR_BODY_MAX:
            return f"{case.name}: {status} error body of {len(body)} bytes"
    return None


def _send_all(server, account, path: str, cases: list[Case], error_key: str) -> dict:
    problems, statuses = [], {}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        for case in cases:
            headers = {"Authorization": f"Bearer {account['key']}"}
            if case.content_type is not None:
                headers["Content-Type"] = case.content_type
            response = client.post(path, content=case.body, headers=headers)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if (problem := _problem(case, response, error_key)) is not None:
                problems.append(problem)
    assert not problems, f"{len(problems)} of {len(cases)} went wrong:\n" + "\n".join(
        problems[:20])
    return statuses


# --- the corpus --------------------------------------------------------------------------

RNG_SEED = 26


def test_the_corpus_is_large_and_varied():
    rng = random.Random(RNG_SEED)
    sizes = [len(f(rng)) for f in (v1_cases, conversation_cases, message_cases, frame_cases)]
    assert sum(sizes) >= 500 and min(sizes) >= 80, sizes


def test_v1_chat_completions(fault_server, account):
    cases = v1_cases(random.Random(RNG_SEED))
    statuses = _send_all(fault_server, account, "/v1/chat/completions", cases, "error")
    # Most are refused, and refusals of each kind are there (not one blanket answer).
    assert {400, 413, 415} <= set(statuses), statuses
    assert statuses[400] > len(cases) // 2, statuses


def test_create_conversation(fault_server, account):
    cases = conversation_cases(random.Random(RNG_SEED))
    statuses = _send_all(fault_server, account, "/api/conversations/", cases, "detail")
    assert {201, 400, 413, 415} <= set(statuses), statuses


def test_send_message(fault_server, account):
    path = f"/api/conversations/{account['conversation_id']}/messages/"
    cases = message_cases(random.Random(RNG_SEED))
    statuses = _send_all(fault_server, account, path, cases, "detail")
    assert {400, 404, 413, 415} <= set(statuses), statuses


async def test_websocket_frames(fault_server, account):
    cases = frame_cases(random.Random(RNG_SEED))
    url = f"{fault_server.ws_url}/ws/chat/{account['conversation_id']}/"
    headers = {"Cookie": f"sessionid={account['sessionid']}"}
    problems = []

    async def next_event(ws) -> dict:
        return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))

    async with connect(url, additional_headers=headers, origin=fault_server.url,
                       max_size=None) as ws:
        assert (await next_event(ws))["type"] == "hello"
        for case in cases:
            # ConnectionClosed here fails the test: the socket must survive every frame.
            # A text frame where the bytes are UTF-8, else a binary one.
            await ws.send(case.body.decode() if _is_utf8(case.body) else case.body)
            await ws.send(json.dumps({"type": "ping"}))
            events = []
            while not events or events[-1]["type"] != "pong":
                events.append(await next_event(ws))
            answers = events[:-1]
            if not answers or any(e["type"] != "error" for e in answers):
                problems.append(f"{case.name}: {answers}")
            elif any(e["code"] == "internal_error" for e in answers):
                problems.append(f"{case.name}: internal_error")
            elif any(len(json.dumps(e)) > ERROR_BODY_MAX for e in answers):
                problems.append(f"{case.name}: an error event of {len(json.dumps(answers))}")
    assert not problems, f"{len(problems)} of {len(cases)} went wrong:\n" + "\n".join(
        problems[:20])


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_normal_requests_are_served_afterwards(fault_server, account, server_log):
    headers = {"Authorization": f"Bearer {account['key']}"}
    with httpx.Client(base_url=fault_server.url, timeout=TIMEOUT, headers=headers) as client:
        reply = client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 2})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["role"] == "assistant"
        made = client.post("/api/conversations/", json={"title": "after the fuzz"})
        assert made.status_code == 201, made.text
        tree = client.get(f"/api/conversations/{account['conversation_id']}/messages/")
        assert tree.status_code == 200 and tree.json()["messages"] == []  # nothing stored
    log = server_log.read()
    assert "Traceback" not in log and "Internal Server Error" not in log, log[-3000:]
