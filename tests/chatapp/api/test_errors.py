"""Acceptance 2: every error case answers its status with OpenAI's error object."""

from __future__ import annotations

import httpx2 as httpx
import openai
import pytest

from tests.chatapp.api.conftest import MODEL

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def key(accounts) -> str:
    return accounts.user_with_key()[1]


@pytest.fixture(scope="module")
def client(key, client_for):
    return client_for(key)


@pytest.fixture(scope="module")
def post(api_server, key):
    def send(body, *, raw: bytes | None = None, headers: dict | None = None):
        hdrs = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        hdrs.update(headers or {})
        return httpx.post(
            api_server.url + "/v1/chat/completions",
            content=raw if raw is not None else None,
            json=body if raw is None else None,
            headers=hdrs,
            timeout=120,
        )

    return send


def assert_error(response, status: int, *, code=None, param=None, type_=None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in response.text
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    if type_ is not None:
        assert error["type"] == type_
    return error


# --- 401 ---------------------------------------------------------------------------


def test_missing_key(post):
    assert_error(post({"model": MODEL, "messages": HELLO}, headers={"Authorization": ""}), 401,
                 code="missing_api_key")


@pytest.mark.parametrize("header", ["Bearer pc-00000000.nope", "Basic abc", "Bearer"])
def test_invalid_key(post, header):
    assert_error(post({"model": MODEL, "messages": HELLO}, headers={"Authorization": header}),
                 401, code="invalid_api_key")


def test_invalid_key_with_the_sdk(client_for):
    with pytest.raises(openai.AuthenticationError) as info:
        client_for("pc-deadbeef.wrong").models.list()
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"


# --- 404 ---------------------------------------------------------------------------


def test_unknown_model(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-17", messages=HELLO, max_tokens=2)
    assert info.value.status_code == 404
    assert info.value.body["code"] == "model_not_found"
    assert info.value.body["param"] == "model"
    assert info.value.body["type"] == "invalid_request_error"


def test_unknown_model_detail_and_url(api_server, key):
    headers = {"Authorization": f"Bearer {key}"}
    assert_error(httpx.get(api_server.url + "/v1/models/gpt-17", headers=headers), 404,
                 code="model_not_found")
    assert_error(httpx.get(api_server.url + "/v1/nothing-here", headers=headers), 404,
                 code="unknown_url")


def test_models_list(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


# --- 400 ---------------------------------------------------------------------------

BAD_REQUESTS = {
    "bad role": ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    "empty messages": ({"messages": []}, "messages"),
    "messages not a list": ({"messages": "hello"}, "messages"),
    "message not an object": ({"messages": ["hello"]}, "messages[0]"),
    "content of wrong type": ({"messages": [{"role": "user", "content": 42}]},
                              "messages[0].content"),
    "image content": ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "messages[0].content"),
    "empty user message": ({"messages": [{"role": "user", "content": "   "}]}, "messages"),
    "ends with assistant": ({"messages": [{"role": "assistant", "content": "hi"}]},
                            "messages[0].role"),
    "temperature too high": ({"temperature": 2.5}, "temperature"),
    "temperature a string": ({"temperature": "hot"}, "temperature"),
    "top_p zero": ({"top_p": 0}, "top_p"),
    "n too large": ({"n": 9}, "n"),
    "n zero": ({"n": 0}, "n"),
    "n a float": ({"n": 1.5}, "n"),
    "max_tokens zero": ({"max_tokens": 0}, "max_tokens"),
    "max_tokens a string": ({"max_tokens": "8"}, "max_tokens"),
    "max_completion_tokens negative": ({"max_completion_tokens": -1}, "max_completion_tokens"),
    "stream not a bool": ({"stream": "yes"}, "stream"),
    "stream_options without stream": ({"stream_options": {"include_usage": True}},
                                      "stream_options"),
    "stop of wrong type": ({"stop": 5}, "stop"),
    "too many stops": ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    "empty stop": ({"stop": [""]}, "stop"),
    "seed a string": ({"seed": "x"}, "seed"),
    "user not a string": ({"user": 5}, "user"),
    "model missing": ({"model": None}, "model"),
    "cache_salt not allowed": ({"cache_salt": "mine"}, "cache_salt"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS), ids=list(BAD_REQUESTS))
def test_invalid_request(post, case):
    fields, param = BAD_REQUESTS[case]
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 2, **fields}
    assert_error(post(body), 400, param=param, type_="invalid_request_error")


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe"])
def test_malformed_body(post, raw):
    assert_error(post(None, raw=raw), 400, type_="invalid_request_error")


def test_body_too_large(post):
    huge = b'{"model": "x", "messages": [], "pad": "' + b"x" * 3_000_000 + b'"}'
    assert_error(post(None, raw=huge), 413, code="request_too_large")


def test_context_length_exceeded(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=100_000)
    assert info.value.status_code == 400
    assert info.value.body["code"] == "context_length_exceeded"
    assert info.value.body["param"] == "messages"


def test_wrong_method(api_server, key):
    response = httpx.get(api_server.url + "/v1/chat/completions",
                         headers={"Authorization": f"Bearer {key}"})
    assert_error(response, 405)


# --- 429 ---------------------------------------------------------------------------


def test_requests_per_minute(accounts, client_for, api_server):
    _, limited = accounts.user_with_key(rpm=2)
    _, other = accounts.user_with_key()
    client = client_for(limited)
    client.models.list()
    client.models.list()
    with pytest.raises(openai.RateLimitError) as info:
        client.models.list()
    assert info.value.status_code == 429
    assert int(info.value.response.headers["Retry-After"]) >= 1
    assert info.value.body["code"] == "rate_limit_exceeded"
    assert_error(info.value.response, 429, type_="rate_limit_error")
    # The conversations API shares the key's budget.
    api = httpx.get(api_server.url + "/api/conversations/",
                    headers={"Authorization": f"Bearer {limited}"})
    assert api.status_code == 429 and int(api.headers["Retry-After"]) >= 1
    # Other keys are not affected.
    assert client_for(other).models.list().data


# --- text no tokenizer may see -------------------------------------------------------

LONE_SURROGATE = '"a \\ud800 b"'  # JSON text: a lone UTF-16 surrogate, valid JSON
NUL = '"a \\u0000 b"'


@pytest.mark.parametrize("messages", [
    f'[{{"role": "user", "content": {LONE_SURROGATE}}}]',
    f'[{{"role": "user", "content": {NUL}}}]',
    f'[{{"role": "system", "content": {LONE_SURROGATE}}}, {{"role": "user", "content": "Hi"}}]',
    f'[{{"role": "user", "content": [{{"type": "text", "text": {NUL}}}]}}]',
    # An assistant turn's text is looked up among remembered replies: checked before that.
    f'[{{"role": "user", "content": "Hi"}}, {{"role": "assistant", "content": {LONE_SURROGATE}}},'
    ' {"role": "user", "content": "Again"}]',
])
def test_text_a_tokenizer_cannot_take_is_a_400(post, messages):
    raw = f'{{"model": "{MODEL}", "max_tokens": 2, "messages": {messages}}}'.encode()
    error = assert_error(post(None, raw=raw), 400, code="invalid_value", param="messages",
                         type_="invalid_request_error")
    assert "surrogate" in error["message"] or "NUL" in error["message"]


def test_an_invalid_escape_is_a_400(post):
    raw = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "a \\x41"}}]}}'
    assert_error(post(None, raw=raw.encode()), 400, type_="invalid_request_error")


def test_the_conversations_api_refuses_such_text(api_server, key):
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    base = api_server.url + "/api/conversations/"
    made = httpx.post(base, json={"title": "t"}, headers=headers, timeout=60)
    assert made.status_code == 201, made.text
    url = f"{base}{made.json()['id']}/messages/"
    for text in (LONE_SURROGATE, NUL):
        response = httpx.post(url, content=f'{{"content": {text}}}'.encode(), headers=headers,
                              timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_value"
    bad_escape = httpx.post(url, content=b'{"content": "a \\x41"}', headers=headers, timeout=60)
    assert bad_escape.status_code == 400
    # A preset variable reaches the prompt too.
    variables = httpx.post(base, content=f'{{"variables": {{"name": {LONE_SURROGATE}}}}}'.encode(),
                           headers=headers, timeout=60)
    assert variables.status_code == 400 and variables.json()["code"] == "invalid_value"
    # Nothing was stored for the refused turns.
    tree = httpx.get(url, headers=headers, timeout=60).json()
    assert tree["messages"] == []
