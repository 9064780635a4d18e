"""Tools on /v1 with the official `openai` SDK against the live server and the real model:
a required or named call is generated under its function's schema, streams as
tool_calls deltas, and comes back in history token for token however the client
re-serialises its arguments."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.chatapp.api.conftest import MODEL

pytestmark = pytest.mark.model

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(accounts, client_for):
    _, key = accounts.user_with_key()
    return client_for(key)


def test_a_required_call_matches_its_schema_streamed_or_not(client):
    done = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                          tool_choice="required", temperature=0,
                                          max_tokens=64)
    [choice] = done.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    schema = {WEATHER["function"]["name"]: WEATHER, TIME["function"]["name"]: TIME}[
        call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)

    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                            tool_choice="required", temperature=0,
                                            max_tokens=64, stream=True)
    chunks = list(stream)
    deltas = [tc for ch in chunks for c in ch.choices if c.delta.tool_calls
              for tc in c.delta.tool_calls]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [
        (call.function.name, call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_named_call_is_that_function(client):
    done = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    [call] = done.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME["function"]["parameters"])


def test_the_tool_loop_keeps_its_cache_with_re_serialised_arguments(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                           tool_choice="required", temperature=0,
                                           max_tokens=64)
    [call] = first.choices[0].message.tool_calls
    # The client sends the call back re-serialised: other spacing, keys sorted.
    arguments = json.dumps(json.loads(call.function.arguments), separators=(",", ":"),
                           sort_keys=True)
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'},
    ]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER],
                                            temperature=0, max_tokens=16)
    turn_one = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= turn_one // 16 * 16 - 16
    assert second.usage.prompt_tokens > turn_one


def test_tools_are_checked_field_by_field(client):
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, WEATHER])
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        client.chat.completions.create(model=MODEL, messages=ASK + [
            {"role": "tool", "content": "18"}])
    with pytest.raises(openai.BadRequestError, match="arguments"):
        client.chat.completions.create(model=MODEL, messages=ASK + [
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "get_weather", "arguments": "not json"}}]}, {"role": "user",
                                                                     "content": "?"}])
