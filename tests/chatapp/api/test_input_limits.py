"""Hostile input over HTTP, in-process (no model: every case is refused before generation).

Deep JSON is a 400 on /v1 and on the conversations API, a non-JSON body a 415, what a
client sent is echoed only briefly, fields /v1 would not honour are refused by name, the
message length rule has one owner, and a body that never arrives is a 408.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from django.core.handlers.asgi import ASGIHandler

from chatapp.accounting.ratelimit import limiter
from chatapp.api import services
from chatapp.api.errors import OpenAIError
from chatapp.api.serializers import MessageCreateSerializer
from chatapp.api.v1.parsing import parse_completion_request
from chatapp.api.v1.tool_params import calls_key
from chatapp.api.v1.unsupported import HONOURED, UNSUPPORTED
from chatapp.body_timeout import BodyTimeoutMiddleware
from chatapp.chat import services as chat_services
from chatapp.chat.errors import InvalidInput
from chatapp.prompts import tools as tools_convention
from tests.chatapp.api.conftest import MODEL

pytestmark = pytest.mark.django_db
HELLO = [{"role": "user", "content": "Hello"}]
DEEP = b"[" * 100_000 + b"]" * 100_000
V1 = "/v1/chat/completions"


@pytest.fixture
def user(django_user_model, settings):
    settings.DEBUG = False
    limiter.reset()
    return django_user_model.objects.create_user("mallory")


@pytest.fixture
def auth(user) -> dict:
    return {"Authorization": f"Bearer {services.api_key_create(user=user)[1]}"}


@pytest.fixture
def conversation(user):
    return chat_services.conversation_create(owner=user)


def openai_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.content[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


def post_raw(client, path, raw: bytes, auth, content_type="application/json"):
    return client.post(path, data=raw, content_type=content_type, headers=auth)


# --- one bounded JSON decoder ------------------------------------------------------------


@pytest.mark.parametrize("raw", [DEEP, b'{"a":' * 50_000 + b"1" + b"}" * 50_000])
def test_deep_json_on_v1_is_a_400(client, auth, raw):
    error = openai_error(post_raw(client, V1, raw, auth), 400, "invalid_json")
    assert "deeper than 32" in error["message"]


def test_deep_json_on_the_conversations_api_is_a_400(client, auth, conversation):
    for path in ("/api/conversations/", f"/api/conversations/{conversation.pk}/messages/"):
        response = post_raw(client, path, DEEP, auth)
        assert response.status_code == 400, response.content[:500]
        assert response.json()["code"] == "parse_error"
        assert "deeper than 32" in response.json()["detail"]


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "model": "n", "messages": []}', b'{"temperature": NaN}', b"[1e999]",
])
def test_what_json_has_not_is_a_400_on_both_apis(client, auth, raw):
    openai_error(post_raw(client, V1, raw, auth), 400, "invalid_json")
    assert post_raw(client, "/api/conversations/", raw, auth).status_code == 400


@pytest.mark.parametrize("limit", ["REQUEST_JSON_MAX_BYTES", "DATA_UPLOAD_MAX_MEMORY_SIZE"])
def test_the_size_limit_is_a_413_on_both_apis(client, auth, conversation, settings, limit):
    # Ours, and Django's on request.body (it follows ours; DRF reads the body through it,
    # and its RequestDataTooBig was a 500 on the conversations API).
    setattr(settings, limit, 1000)
    raw = json.dumps({"title": "x" * 2000}).encode()
    for path in ("/api/conversations/", f"/api/conversations/{conversation.pk}/messages/"):
        response = post_raw(client, path, raw, auth)
        assert response.status_code == 413 and response.json()["code"] == "request_too_large"
    openai_error(post_raw(client, V1, raw, auth), 413, "request_too_large")


# --- content types -----------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [
    "multipart/form-data; boundary=xyz", "application/x-www-form-urlencoded", "text/plain",
])
def test_a_body_that_is_not_json_is_a_415(client, auth, content_type):
    body = json.dumps({"model": "no-such-model", "messages": HELLO}).encode()
    error = openai_error(post_raw(client, V1, body, auth, content_type), 415,
                         "unsupported_media_type")
    assert "application/json" in error["message"]
    response = post_raw(client, "/api/conversations/", body, auth, content_type)
    assert response.status_code == 415 and response.json()["code"] == "unsupported_media_type"


def test_a_real_multipart_upload_is_a_415_with_an_error_object(client, auth):
    response = client.post(V1, {"file": "x" * 100}, headers=auth)  # the client's multipart
    openai_error(response, 415, "unsupported_media_type")


def test_a_json_type_with_a_charset_or_a_suffix_is_json(client, auth):
    body = json.dumps({"model": "no-such-model", "messages": HELLO}).encode()
    for content_type in ("application/json; charset=utf-8", "application/vnd.x+json", ""):
        openai_error(post_raw(client, V1, body, auth, content_type), 404, "model_not_found")


# --- bounded echoes ----------------------------------------------------------------------


def test_an_unknown_model_name_is_echoed_briefly(client, auth):
    body = json.dumps({"model": "m" * 1_000_000, "messages": HELLO}).encode()
    response = post_raw(client, V1, body, auth)
    error = openai_error(response, 404, "model_not_found")
    assert "mmmm" in error["message"] and len(response.content) < 1000


def test_other_quoted_input_is_echoed_briefly(client, auth):
    role = {"role": {"x": "y" * 100_000}, "content": "hi"}
    body = json.dumps({"model": MODEL, "messages": [role]}).encode()
    assert len(post_raw(client, V1, body, auth).content) < 1000
    assert len(client.get("/v1/" + "p" * 10_000, headers=auth).content) < 1000
    ordering = client.get("/api/conversations/?ordering=" + "o" * 10_000, headers=auth)
    assert ordering.status_code == 400 and len(ordering.content) < 1000
    variables = json.dumps({"variables": {"v" * 100_000: 1}}).encode()
    response = post_raw(client, "/api/conversations/", variables, auth)
    assert response.status_code == 400 and len(response.content) < 1000
    upload = post_raw(client, "/api/conversations/", b"{}", auth,
                      "multipart/form-data; boundary=" + "b" * 10_000)
    assert upload.status_code == 415 and len(upload.content) < 1000


# --- fields /v1 would not honour ---------------------------------------------------------

REFUSED = {
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "store": True,
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "moderation": {"input": {"mode": "block"}},
}
NEUTRAL = {
    "tools": [], "tool_choice": "none", "functions": [], "logprobs": False, "frequency_penalty": 0,
    "presence_penalty": 0.0, "response_format": {"type": "text"}, "logit_bias": {},
    "store": False, "modalities": ["text"], "top_logprobs": None,
    # Hints that do not change the reply.
    "metadata": {"a": "b"}, "service_tier": "auto", "prompt_cache_key": "k",
    "prompt_cache_options": {"ttl": "1h"}, "safety_identifier": "s", "user": "u",
}


def test_every_refused_field_is_in_the_one_list():
    assert set(REFUSED) <= set(UNSUPPORTED)


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_field_we_would_not_honour_is_refused_by_name(client, auth, name):
    # An unknown model: were the field let through, the answer would be its 404.
    body = json.dumps({"model": "no-such-model", "messages": HELLO, name: REFUSED[name]})
    body = body.encode()
    error = openai_error(post_raw(client, V1, body, auth), 400, "unsupported_parameter")
    assert error["param"] == name and name in error["message"]


def test_neutral_values_pass_the_check(client, auth):
    # An unknown model answers 404 after the body is parsed: these passed the check.
    body = json.dumps({"model": "no-such-model", "messages": HELLO, **NEUTRAL}).encode()
    openai_error(post_raw(client, V1, body, auth), 404, "model_not_found")


@pytest.mark.parametrize("name, hint", [
    ("max_token", "Did you mean 'max_tokens'?"),
    ("temprature", "Did you mean 'temperature'?"),
    ("foo", ""),
])
def test_an_unknown_field_is_refused_by_name(client, auth, name, hint):
    body = json.dumps({"model": "no-such-model", "messages": HELLO, name: 1}).encode()
    error = openai_error(post_raw(client, V1, body, auth), 400, "unknown_parameter")
    assert error["param"] == name and f"'{name}'" in error["message"]
    assert hint in error["message"]


def test_a_huge_unknown_field_name_is_echoed_briefly(client, auth):
    body = json.dumps({"model": MODEL, "messages": HELLO, "x" * 100_000: 1}).encode()
    response = post_raw(client, V1, body, auth)
    openai_error(response, 400, "unknown_parameter")
    assert len(response.content) < 1000


class _Reads(dict):
    """A body that records which fields the parser looked at."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_the_honoured_list_is_what_the_parser_reads():
    body = _Reads({"model": MODEL, "messages": HELLO})
    parse_completion_request(body)
    assert body.read - {"messages"} <= HONOURED and "messages" in HONOURED
    # Every field it reads, it reads from any body; so the list is exactly those.
    assert body.read == HONOURED


SAMPLING = {"presence_penalty": 0.5, "frequency_penalty": -1.5, "repetition_penalty": 1.2,
            "top_k": 40, "min_p": 0.05, "logit_bias": {"50": -100, "7": 2.5}}


def test_sampling_fields_are_parsed():
    req = parse_completion_request({"model": MODEL, "messages": HELLO, **SAMPLING})
    assert (req.presence_penalty, req.frequency_penalty, req.repetition_penalty, req.top_k,
            req.min_p) == (0.5, -1.5, 1.2, 40, 0.05)
    assert req.logit_bias == {50: -100.0, 7: 2.5}
    off = parse_completion_request({"model": MODEL, "messages": HELLO, "top_k": -1})
    assert off.top_k == 0 and off.logit_bias == {} and off.repetition_penalty == 1.0


@pytest.mark.parametrize("name, value, says", [
    ("presence_penalty", 2.5, "must be in [-2, 2]"),
    ("frequency_penalty", "1", "must be a number"),
    ("repetition_penalty", 0, "must be in (0, 2]"),
    ("repetition_penalty", 3, "must be in (0, 2]"),
    ("top_k", 1.5, "must be an integer"),
    ("top_k", -2, "must be at least -1"),
    ("min_p", 1.5, "must be in [0, 1]"),
    ("logit_bias", [1, 2], "must be an object"),
    ("logit_bias", {"abc": 1}, "keys must be token ids"),
    ("logit_bias", {"-5": 1}, "keys must be token ids"),
    ("logit_bias", {"5": 101}, "values must be numbers in [-100, 100]"),
    ("logit_bias", {"5": True}, "values must be numbers in [-100, 100]"),
    ("logit_bias", {str(i): 1 for i in range(1025)}, "at most 1024"),
    ("min_tokens", -1, "must be at least 0"),
    ("ignore_eos", 1, "must be a boolean"),
])
def test_a_bad_sampling_field_is_a_400_naming_it(client, auth, name, value, says):
    body = json.dumps({"model": MODEL, "messages": HELLO, name: value}).encode()
    error = openai_error(post_raw(client, V1, body, auth), 400)
    assert error["param"] == name and says in error["message"], error


# --- the message length rule has one owner -----------------------------------------------


def test_the_conversations_api_defers_to_the_message_rule(settings):
    settings.MAX_USER_MESSAGE_CHARS = 20_000
    assert MessageCreateSerializer(data={"content": "x" * 17_000}).is_valid()
    settings.MAX_USER_MESSAGE_CHARS = 100
    body = MessageCreateSerializer(data={"content": "x" * 101})
    assert not body.is_valid()
    assert "limit is 100" in str(body.errors["content"][0])
    for bad in ("   ", 5, None, "a\x00b"):
        assert not MessageCreateSerializer(data={"content": bad}).is_valid(), bad


# --- the message shape rule has one owner -------------------------------------------------


@pytest.mark.parametrize("content, message, code", [
    (42, "'messages[1].content' must be a string or an array of text parts.", "invalid_type"),
    ([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}],
     "'messages[1].content[1]' must be a text part; other kinds are not supported by this "
     "model.", "invalid_value"),
    ([{"type": "text", "text": 5}], "'messages[1].content[0]' must be a text part; other "
     "kinds are not supported by this model.", "invalid_value"),
])
def test_v1_refuses_a_content_that_is_not_text_naming_the_field(content, message, code):
    # The rule is the prompt manager's (chatapp.prompts.services.content_text).
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    with pytest.raises(OpenAIError) as err:
        parse_completion_request({"model": MODEL, "messages": messages})
    assert (err.value.message, err.value.param, err.value.code) == (
        message, "messages[1].content", code)


def test_v1_joins_text_parts_of_every_role_tool_results_included():
    parts = [{"type": "text", "text": "Sun"}, {"type": "text", "text": "ny."}]
    call = {"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    req = parse_completion_request({"model": MODEL, "messages": [
        {"role": "developer", "content": parts},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": parts},
    ]})
    turns, keys = req.turns(tools_convention.HERMES)
    assert turns[0] == ("system", "Sunny.") and turns[1] == ("user", "Sunny.")
    assert turns[2][0] == "assistant" and keys == {turns[2][1]: calls_key(["c1"])}
    assert turns[3] == (tools_convention.HERMES.result_role,
                        tools_convention.HERMES.response_text("Sunny."))


# --- the title rule has one owner ---------------------------------------------------------


def test_the_api_and_the_page_refuse_a_long_title_with_the_same_message(client, auth, user,
                                                                        conversation):
    title = "t" * 201
    message = "Title is at most 200 characters (this one has 201)."
    for response in (
        client.post("/api/conversations/", {"title": title}, "application/json", headers=auth),
        client.patch(f"/api/conversations/{conversation.pk}/", {"title": title},
                     "application/json", headers=auth),
    ):
        assert response.status_code == 400, response.content[:500]
        assert response.json()["errors"]["title"] == [message]
    client.force_login(user)
    page = client.post(f"/c/{conversation.pk}/rename/", {"title": title})
    assert page.status_code == 400 and message in page.content.decode()
    conversation.refresh_from_db()
    assert conversation.title == ""
    for bad in ("a\x00b", "a\ud800b"):
        response = client.post("/api/conversations/", json.dumps({"title": bad}),
                               "application/json", headers=auth)
        assert response.status_code == 400
        with pytest.raises(InvalidInput) as refused:
            chat_services.conversation_rename(conversation=conversation, title=bad)
        assert response.json()["errors"]["title"] == [refused.value.message]
    # 200 characters pass everywhere, stripped.
    renamed = client.patch(f"/api/conversations/{conversation.pk}/", {"title": f" {'t' * 200} "},
                           "application/json", headers=auth)
    assert renamed.status_code == 200 and renamed.json()["title"] == "t" * 200


# --- a body that never arrives -------------------------------------------------------------


async def call_asgi(app, path: str, chunks: list[bytes], *, then_wait: bool) -> list[dict]:
    """Run one HTTP request through `app`: the body's chunks, the last one ending the body
    unless `then_wait` (a client that stalls mid-body)."""
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"host", b"testserver"),
                                              (b"content-type", b"application/json"),
                                              (b"content-length", b"1000")],
             "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 1),
             "http_version": "1.1", "asgi": {"version": "3.0"}}
    pending = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    pending[-1]["more_body"] = then_wait  # complete unless the client is to stall
    sent: list[dict] = []

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # the client stays, sending nothing more

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 30)
    return sent


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path, shape", [(V1, "error"), ("/api/conversations/", "detail")])
async def test_a_body_that_stops_arriving_is_a_408(path, shape, caplog):
    app = BodyTimeoutMiddleware(ASGIHandler(), timeout_s=0.3)
    sent = await call_asgi(app, path, [b'{"model": '], then_wait=True)
    start, body = sent
    assert start["status"] == 408 and (b"connection", b"close") in start["headers"]
    assert shape in json.loads(body["body"])
    assert "answered 408" in caplog.text


@pytest.mark.django_db(transaction=True)
async def test_the_timeout_does_not_touch_a_body_that_arrives():
    app = BodyTimeoutMiddleware(ASGIHandler(), timeout_s=5)
    sent = await call_asgi(app, "/api/conversations/", [b"{}"], then_wait=False)
    assert sent[0]["status"] == 401  # reached the view: no key


def test_the_server_app_has_the_timeout():
    from chatapp import asgi

    assert isinstance(asgi.http_app, BodyTimeoutMiddleware)


# --- many or long messages are refused before any text is tokenized ----------------------


@pytest.fixture
def no_tokenizing(monkeypatch):
    """Fails the test if a request gets as far as loading a tokenizer or building a prompt."""
    from chatapp.api.v1 import completions

    def tokenized(*args, **kw):
        raise AssertionError("the request was tokenized")

    monkeypatch.setattr(completions, "builder_for", tokenized)
    return completions


def test_more_messages_than_the_limit_are_refused_before_the_prompt_is_built(
        client, auth, no_tokenizing, monkeypatch):
    async def no_tokenizer(*args, **kw):
        raise AssertionError("a tokenizer was loaded")

    monkeypatch.setattr(no_tokenizing, "aget_tokenizer", no_tokenizer)
    # 50,000 one-word messages: 1.7 MB, under the body limit.
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 50_000})
    error = openai_error(post_raw(client, V1, body.encode(), auth), 400, "array_above_max_length")
    assert error["param"] == "messages" and "at most 2048" in error["message"]


def test_the_message_count_limit_is_a_setting(settings):
    settings.API_MAX_MESSAGES = 3
    parse_completion_request({"model": MODEL, "messages": HELLO * 3})
    with pytest.raises(OpenAIError) as err:
        parse_completion_request({"model": MODEL, "messages": HELLO * 4})
    assert err.value.param == "messages" and "at most 3 messages; got 4" in err.value.message


def test_messages_longer_than_the_context_can_hold_are_refused_before_tokenizing(
        client, auth, no_tokenizing):
    # 100 messages of 10,000 characters: more than the context's tokens can carry, however
    # many characters the tokenizer's longest token spells.
    messages = [{"role": "user", "content": "word " * 2000}] * 100
    body = json.dumps({"model": MODEL, "messages": messages}).encode()
    error = openai_error(post_raw(client, V1, body, auth), 400, "context_length_exceeded")
    assert error["param"] == "messages" and "1000000 characters" in error["message"]


class _Vocabulary:
    """A tokenizer whose longest token spells 4 characters, and no normalizer."""

    backend_tokenizer = type("Backend", (), {"normalizer": None})()

    def get_vocab(self) -> dict:
        return {"a": 0, "abcd": 1}


@pytest.mark.parametrize("chars, truncation, refused", [
    (401, "disabled", True),
    (400, "disabled", False),  # at most 4 characters a token: 100 tokens may hold it
    (401, "auto", False),  # the oldest turns are left out instead
])
def test_the_size_bound_is_the_context_times_the_longest_token(
        user, no_tokenizing, monkeypatch, chars, truncation, refused):
    monkeypatch.setattr(no_tokenizing.prompting, "context_tokens", lambda *a, **kw: 100)
    req = parse_completion_request({"model": MODEL, "truncation": truncation, "messages": [
        {"role": "system", "content": "s" * 1}, {"role": "user", "content": "u" * (chars - 1)}]})
    key = services.api_key_create(user=user)[0]
    with pytest.raises(OpenAIError if refused else AssertionError) as err:
        no_tokenizing.prepare(key=key, req=req, tokenizer=_Vocabulary(), model=MODEL)
    if refused:
        assert err.value.code == "context_length_exceeded" and "401 characters" in err.value.message
