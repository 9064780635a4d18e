"""Structured outputs on /v1: response_format json_object and json_schema.

The official `openai` SDK against the live server and the real model (marked `model`), and
the body's response_format checks in-process.
"""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from chatapp.api.errors import OpenAIError
from chatapp.api.v1.completions import Completion, check_schema
from chatapp.api.v1.parsing import JSON_OBJECT_SCHEMA, parse_completion_request
from tests.chatapp.api.conftest import MODEL

SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"type": "string", "enum": ["red", "orange", "yellow", "green", "blue"]},
        "count": {"type": "integer"},
        "reason": {"type": "string"},
    },
    "required": ["colour", "count", "reason"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Reply in JSON: your favourite colour of the rainbow, "
                                   "how many colours it has, and why."}]
JSON_SCHEMA = {"type": "json_schema",
               "json_schema": {"name": "colour", "schema": SCHEMA, "strict": True}}


# A required property that contains itself: no finite value.
RECURSIVE = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}},
                             "required": ["c"]}}, "$ref": "#/$defs/n"}


class City(BaseModel):
    city: str
    country: str
    population: int
    size: Literal["village", "town", "city"]


@pytest.fixture(scope="module")
def client(accounts, client_for):
    _, key = accounts.user_with_key()
    return client_for(key)


@pytest.mark.model
def test_json_schema_content_validates(client):
    done = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=150,
                                          temperature=0, response_format=JSON_SCHEMA)
    [choice] = done.choices
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


@pytest.mark.model
def test_streaming_gives_the_same_json_in_deltas(client):
    whole = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=150,
                                           temperature=0, response_format=JSON_SCHEMA)
    stream = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=150,
                                            temperature=0, response_format=JSON_SCHEMA,
                                            stream=True)
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert len(chunks) > 3 and chunks[-1].choices[0].finish_reason == "stop"
    assert text == whole.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.model
def test_parse_with_a_pydantic_model(client):
    # Newer SDKs have parse() on chat.completions; older ones only under beta.
    completions = getattr(client.chat.completions, "parse", None) and client.chat.completions
    completions = completions or client.beta.chat.completions
    done = completions.parse(
        model=MODEL, max_tokens=150, temperature=0, response_format=City,
        messages=[{"role": "user", "content": "Describe a city as JSON."}],
    )
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.city and parsed.population >= 0


@pytest.mark.model
def test_json_object_returns_a_parseable_object(client):
    done = client.chat.completions.create(
        model=MODEL, max_tokens=150, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give a person's name and age as JSON."}],
    )
    assert done.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(done.choices[0].message.content), dict)


@pytest.mark.model
@pytest.mark.parametrize("schema,needle", [
    ({"type": "foo"}, "foo"),
    ({"type": "object", "not": {"required": ["a"]}}, "not"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
    ({"$ref": "#"}, "no JSON value"),
    # Compiles in the grammar library, whose parser then runs out of its limits mid-reply.
    (RECURSIVE, "no JSON value"),
])
def test_an_invalid_schema_raises_bad_request(client, schema, needle):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=8,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "bad", "schema": schema}},
        )
    error = err.value.body
    assert error["param"] == "response_format" and needle in error["message"]


# --- the body's checks, in-process ------------------------------------------------------

def body(response_format) -> dict:
    return {"model": MODEL, "messages": ASK, "response_format": response_format}


def test_text_json_object_and_json_schema_become_the_schema_to_enforce():
    assert parse_completion_request(body({"type": "text"})).json_schema is None
    assert parse_completion_request(body(None)).json_schema is None
    assert parse_completion_request(body({"type": "json_object"})).json_schema == \
        JSON_OBJECT_SCHEMA
    req = parse_completion_request(body(JSON_SCHEMA))
    # Key order is kept: properties are generated in the order the schema lists them.
    assert list(json.loads(req.json_schema)["properties"]) == ["colour", "count", "reason"]
    assert json.loads(req.json_schema) == SCHEMA


@pytest.mark.parametrize("response_format,path", [
    ("json", "response_format"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}},
     "json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a"}}, "json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}},
     "json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": "yes"}},
     "json_schema.strict"),
])
def test_a_malformed_response_format_is_a_400_naming_the_part(response_format, path):
    with pytest.raises(OpenAIError) as err:
        parse_completion_request(body(response_format))
    assert err.value.status == 400 and err.value.param == "response_format"
    assert path in err.value.message


def test_a_schema_we_cannot_enforce_is_refused_before_any_job():
    with pytest.raises(OpenAIError) as err:
        check_schema(json.dumps({"type": "object", "not": {"type": "string"}}))
    assert err.value.status == 400 and err.value.param == "response_format"
    assert err.value.code == "invalid_json_schema" and "not" in err.value.message
    check_schema(json.dumps(SCHEMA))  # and one we can passes


def test_a_job_carries_its_schema_as_text_to_a_worker():
    import dataclasses

    from chatapp.generation.jobs import Job, Options

    job = Job(prompt_ids=(1, 2), cache_salt="s", options=Options(json_schema=json.dumps(SCHEMA)))
    sent = json.loads(json.dumps(dataclasses.asdict(job)))  # as the Celery task gets it
    assert Job.from_dict(sent) == job


@pytest.mark.parametrize("schema", [
    RECURSIVE,
    {"type": "object", "properties": {"a": {"type": "string"}, "b": RECURSIVE["$defs"]["n"]},
     "required": ["a", "b"], "$defs": RECURSIVE["$defs"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
])
def test_a_schema_with_no_finite_value_is_refused_before_any_job(schema):
    with pytest.raises(OpenAIError) as err:
        check_schema(json.dumps(schema))
    assert err.value.status == 400 and err.value.param == "response_format"
    assert err.value.code == "invalid_json_schema" and "no JSON value" in err.value.message


def failed_output(error: str):
    from types import SimpleNamespace

    return SimpleNamespace(finished=True, finish_reason="error", error=error)


@pytest.mark.parametrize("tool_choice, param", [(None, "response_format"),
                                                ("required", "tools")])
def test_a_grammar_failing_mid_reply_is_a_400_naming_the_schemas_field(tool_choice, param):
    # Whatever a schema that compiled does to the parser later, the schema is the caller's.
    from inference.grammar import FAILED

    tools = {"tools": [{"type": "function", "function": {"name": "f"}}],
             "tool_choice": tool_choice} if tool_choice else {"response_format": JSON_SCHEMA}
    req = parse_completion_request({"model": MODEL, "messages": ASK, **tools})
    completion = Completion(req=req, prepared=None, generation=None)
    with pytest.raises(OpenAIError) as err:
        completion.check(failed_output(FAILED + "parser error: Too many items (limit 20000)"))
    assert err.value.status == 400 and err.value.param == param
    assert err.value.code == "invalid_json_schema" and "Too many items" in err.value.message
    with pytest.raises(OpenAIError) as err:
        completion.check(failed_output("generation failed: out of memory"))
    assert err.value.status == 500 and "memory" not in err.value.message
