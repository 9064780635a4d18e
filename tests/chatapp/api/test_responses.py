"""/v1/responses with the official `openai` package against the live server and the real
model: create (plain and streamed), continue with previous_response_id on the stored ids
(the cache serves every earlier turn), tools, structured output, retrieve, delete, tenants,
and a 400 for every field it would not honour."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest
from pydantic import BaseModel

from tests.chatapp.api.conftest import MODEL

pytestmark = pytest.mark.model

BLOCK = 16
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."
QUESTIONS = (
    "Which colour do you get when you mix blue and yellow paint?",
    "Name one animal that lives in the sea.",
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What do bees make?",
    "Which planet is closest to the sun?",
)
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def key(accounts) -> str:
    return accounts.user_with_key()[1]


@pytest.fixture(scope="module")
def client(client_for, key):
    return client_for(key)


@pytest.fixture(scope="module")
def http(api_server, key):
    with httpx.Client(base_url=api_server.url, headers={"Authorization": f"Bearer {key}"},
                      timeout=300) as raw:
        yield raw


def computed(previous) -> int:
    """What the engine computed for a response and kept in whole blocks: its prompt and its
    reply, but for the reply's last token, which is sampled and never run through the model
    (so it has no K/V to cache)."""
    usage = previous.usage
    return (usage.input_tokens + usage.output_tokens - 1) // BLOCK * BLOCK


def test_create_answers_a_response_object(client):
    done = client.responses.create(model=MODEL, input=QUESTIONS[0], instructions=INSTRUCTIONS,
                                   max_output_tokens=12, temperature=0,
                                   metadata={"purpose": "test"})
    assert done.object == "response" and done.id.startswith("resp_")
    assert done.model == MODEL and done.status in ("completed", "incomplete")
    assert done.instructions == INSTRUCTIONS and done.metadata == {"purpose": "test"}
    [message] = done.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text"
    assert done.output_text == message.content[0].text and done.output_text
    usage = done.usage
    assert 1 <= usage.output_tokens <= 12
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    if done.status == "incomplete":
        assert done.incomplete_details.reason == "max_output_tokens"
    # Stored by default (OpenAI's `store: true`): retrieved as it was answered.
    again = client.responses.retrieve(done.id)
    assert again.model_dump() == done.model_dump()


def test_streaming_with_previous_response_id(client):
    first = client.responses.create(model=MODEL, input=QUESTIONS[1], max_output_tokens=8,
                                    temperature=0)
    events = list(client.responses.create(model=MODEL, input=QUESTIONS[2], stream=True,
                                          previous_response_id=first.id, max_output_tokens=8,
                                          temperature=0))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.output_item.added" in kinds and "response.content_part.added" in kinds
    assert kinds.index("response.output_text.done") > max(
        i for i, k in enumerate(kinds) if k == "response.output_text.delta")
    created, done = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == []
    assert created.id == done.id and done.previous_response_id == first.id
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    [text_done] = [e for e in events if e.type == "response.output_text.done"]
    assert text and text == text_done.text == done.output_text
    assert done.usage.input_tokens_details.cached_tokens >= computed(first)
    assert client.responses.retrieve(done.id).model_dump() == done.model_dump()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_six_turns_hit_the_cache_on_the_stored_ids(client, stream):
    """The client sends only each new question: every turn's prompt is the previous
    turn's prompt and reply, token for token, so the cache serves all of it."""
    previous = None
    for n, question in enumerate(QUESTIONS):
        kwargs = {"previous_response_id": previous.id} if previous else {}
        # Some turns end at their limit, others at the end token: both are replayed.
        args = dict(model=MODEL, input=f"{n + 1}. {question}", instructions=INSTRUCTIONS,
                    max_output_tokens=6 + 4 * (n % 3), temperature=0, **kwargs)
        if stream:
            events = list(client.responses.create(stream=True, **args))
            done = events[-1].response
        else:
            done = client.responses.create(**args)
        if previous is not None:
            assert done.usage.input_tokens > previous.usage.input_tokens + (
                previous.usage.output_tokens)
            cached = done.usage.input_tokens_details.cached_tokens
            assert cached >= computed(previous), (n, previous.usage, done.usage)
        previous = done


def test_a_client_sending_the_output_back_still_hits_the_cache(client):
    """Without previous_response_id (store false), the stateless way: the reply's text
    comes back as an input item and its generated ids are spliced back."""
    turn = [{"role": "user", "content": QUESTIONS[3]}]
    one = client.responses.create(model=MODEL, input=turn, instructions=INSTRUCTIONS,
                                  store=False, max_output_tokens=8, temperature=0)
    turn += [item.model_dump(exclude_none=True) for item in one.output]
    turn.append({"role": "user", "content": QUESTIONS[4]})
    two = client.responses.create(model=MODEL, input=turn, instructions=INSTRUCTIONS,
                                  store=False, max_output_tokens=8, temperature=0)
    assert two.usage.input_tokens_details.cached_tokens >= computed(one)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(one.id)  # not stored


def test_function_tools_and_their_outputs(client):
    call = client.responses.create(model=MODEL, input="What is the weather in Paris?",
                                   tools=[WEATHER], tool_choice="required",
                                   max_output_tokens=40, temperature=0)
    calls = [item for item in call.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    assert call.tools[0].name == "get_weather"
    # The result goes back as a function_call_output; the call itself is never sent back.
    events = list(client.responses.create(
        model=MODEL, previous_response_id=call.id, tools=[WEATHER], stream=True,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": '{"temperature": 18}'}],
        max_output_tokens=12, temperature=0))
    done = events[-1].response
    assert done.usage.input_tokens_details.cached_tokens >= computed(call)
    assert done.output


def test_a_forced_call_streams_its_arguments(client):
    events = list(client.responses.create(
        model=MODEL, input="Weather in Rome?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, stream=True,
        max_output_tokens=40, temperature=0))
    kinds = [e.type for e in events]
    [args] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args.arguments)["city"]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[-1].item.type == "function_call"
    assert kinds[-1] == "response.completed"
    assert events[-1].response.output[-1].arguments == args.arguments


def test_the_sdks_stream_helper_rebuilds_the_response(client):
    """responses.stream() rebuilds the response from the events alone: they must agree.
    (It wants `response.completed`: a reply cut at max_output_tokens ends with
    `response.incomplete`, as OpenAI's do, so these replies have room to end.)"""
    with client.responses.stream(model=MODEL, input=QUESTIONS[4], instructions=INSTRUCTIONS,
                                 max_output_tokens=60, temperature=0) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text and final.output_text == text
    with client.responses.stream(model=MODEL, input="Weather in Oslo?", tools=[WEATHER],
                                 tool_choice="required", max_output_tokens=40,
                                 temperature=0) as stream:
        final = stream.get_final_response()
    assert json.loads(final.output[-1].arguments)["city"]


class City(BaseModel):
    city: str
    country: str


def test_structured_output_with_text_format(client):
    parsed = client.responses.parse(model=MODEL, input="Describe a city as JSON.",
                                    text_format=City, max_output_tokens=60, temperature=0)
    assert isinstance(parsed.output_parsed, City)
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    done = client.responses.create(
        model=MODEL, input="A colour?", max_output_tokens=20, temperature=0,
        text={"format": {"type": "json_schema", "name": "colour", "schema": schema}})
    assert json.loads(done.output_text)["colour"] in ("red", "green", "blue")
    assert done.text.format.type == "json_schema"


def test_another_tenants_response_is_not_found(accounts, client_for, client):
    mine = client.responses.create(model=MODEL, input=QUESTIONS[5], max_output_tokens=4,
                                   temperature=0)
    other = client_for(accounts.user_with_key()[1])
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError) as exc:
        other.responses.create(model=MODEL, input="Go on.", previous_response_id=mine.id)
    assert exc.value.body["param"] == "previous_response_id"
    assert client.responses.retrieve(mine.id).id == mine.id  # still there for its owner


def test_delete(client):
    one = client.responses.create(model=MODEL, input=QUESTIONS[0], max_output_tokens=4,
                                  temperature=0)
    two = client.responses.create(model=MODEL, input=QUESTIONS[1], max_output_tokens=4,
                                  temperature=0, previous_response_id=one.id)
    client.responses.delete(one.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(one.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(one.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Go on.", previous_response_id=one.id)
    # The later response is still there, but its history lost a turn: it cannot go on.
    assert client.responses.retrieve(two.id).previous_response_id == one.id
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model=MODEL, input="Go on.", previous_response_id=two.id)
    assert "deleted" in exc.value.message


def test_not_stored_is_not_found(client):
    done = client.responses.create(model=MODEL, input=QUESTIONS[2], store=False,
                                   max_output_tokens=4, temperature=0)
    assert done.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Go on.", previous_response_id=done.id)


BASE = {"model": MODEL, "input": "Hello?", "max_output_tokens": 4}

REFUSALS = {
    # name: (extra fields, status, param, code)
    "unknown field": ({"foo": 1}, "foo", "unknown_parameter"),
    "misspelt field": ({"max_output_token": 4}, "max_output_token", "unknown_parameter"),
    "background": ({"background": True}, "background", "unsupported_parameter"),
    "include": ({"include": ["message.output_text.logprobs"]}, "include",
                "unsupported_parameter"),
    "reasoning": ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    "top_logprobs": ({"top_logprobs": 3}, "top_logprobs", "unsupported_parameter"),
    "conversation": ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    "prompt template": ({"prompt": {"id": "pmpt_1"}}, "prompt", "unsupported_parameter"),
    "max_tool_calls": ({"max_tool_calls": 2}, "max_tool_calls", "unsupported_parameter"),
    "text.verbosity": ({"text": {"verbosity": "low"}}, "text.verbosity",
                       "unsupported_parameter"),
    "a hosted tool": ({"tools": [{"type": "web_search"}]}, "tools[0].type",
                      "unsupported_parameter"),
    "a function tool's unknown key": ({"tools": [{**WEATHER, "defer_loading": True}]},
                                      "tools[0].defer_loading", "unsupported_parameter"),
    "a function tool's bad name": ({"tools": [{**WEATHER, "name": "no spaces"}]},
                                   "tools[0].name", "invalid_value"),
    "tool_choice of a hosted tool": ({"tools": [WEATHER], "tool_choice": {"type": "web_search"}},
                                     "tool_choice", "unsupported_parameter"),
    "tool_choice without tools": ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    "an image input": ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
        "input[0].content[0].type", "unsupported_parameter"),
    "an item reference": ({"input": [{"type": "item_reference", "id": "msg_1"}]},
                          "input[0].type", "unsupported_parameter"),
    "a role it does not know": ({"input": [{"role": "robot", "content": "Hi"}]},
                                "input[0].role", "invalid_value"),
    "a call output without its call id": ({"input": [{"type": "function_call_output",
                                                      "output": "1"}]},
                                          "input[0].call_id", "invalid_type"),
    "no input": ({"input": None}, "input", "invalid_type"),
    "an empty input": ({"input": []}, "input", "invalid_type"),
    "an assistant message last": ({"input": [{"role": "assistant", "content": "Hi"}]}, "input",
                                  "invalid_value"),
    "a blank message": ({"input": "   "}, "input", "invalid_value"),
    "text.format of an unknown type": ({"text": {"format": {"type": "xml"}}}, "text.format",
                                       "invalid_value"),
    "text.format without a name": ({"text": {"format": {"type": "json_schema", "schema": {}}}},
                                   "text.format", "invalid_value"),
    "a schema it cannot enforce": ({"text": {"format": {
        "type": "json_schema", "name": "x",
        "schema": {"not": {"type": "string"}}}}}, "text.format", None),
    "max_output_tokens 0": ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    "temperature out of range": ({"temperature": 3}, "temperature", "invalid_value"),
    "truncation of an unknown kind": ({"truncation": "sometimes"}, "truncation",
                                      "invalid_value"),
    "store not a boolean": ({"store": "yes"}, "store", "invalid_type"),
    "instructions not a string": ({"instructions": ["a"]}, "instructions", "invalid_type"),
    "previous_response_id not a string": ({"previous_response_id": 7}, "previous_response_id",
                                          "invalid_type"),
    "metadata too large": ({"metadata": {"k": "v" * 600}}, "metadata", "invalid_value"),
    "a model it does not serve": ({"model": "gpt-nothing"}, "model", "model_not_found"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusals_name_the_field(http, name):
    extra, param, code = REFUSALS[name]
    resp = http.post("/v1/responses", json={**BASE, **extra})
    assert resp.status_code == (404 if code == "model_not_found" else 400), resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    assert error["type"] == "invalid_request_error"


def test_a_typo_gets_the_nearest_field(http):
    error = http.post("/v1/responses", json={**BASE, "max_output_token": 4}).json()["error"]
    assert "Did you mean 'max_output_tokens'?" in error["message"]


def test_refusals_of_retrieve_and_delete(http, client):
    assert http.get("/v1/responses/resp_nothing").status_code == 404
    assert http.delete("/v1/responses/resp_nothing").json()["error"]["code"] == (
        "response_not_found")
    assert http.put("/v1/responses/resp_nothing").status_code == 405
    done = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    resp = http.get(f"/v1/responses/{done.id}", params={"stream": "true"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "stream"
