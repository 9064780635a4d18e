"""A forced tool call's schema, in-process: each function's local `$ref`s resolve within
its own parameters, and a parameters schema we cannot enforce is refused naming that
tool (tools[i].function.parameters), never response_format."""

from __future__ import annotations

import json

import jsonschema
import pytest

from chatapp.accounting.ratelimit import limiter
from chatapp.api import services
from chatapp.api.v1.tool_params import parse_tools, rebase_refs
from chatapp.prompts.tools import HERMES
from inference.grammar import grammar_for_schema
from tests.chatapp.api.conftest import MODEL


def function(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


# Two functions whose $defs share a name but not a meaning.
PLACE = function("place", {
    "type": "object", "properties": {"where": {"$ref": "#/$defs/spot"}}, "required": ["where"],
    "$defs": {"spot": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"], "additionalProperties": False}},
})
COUNT = function("count", {
    "type": "object", "properties": {"n": {"$ref": "#/$defs/spot"},
                                     "more": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["n"], "$defs": {"spot": {"type": "integer", "minimum": 0}},
})


@pytest.mark.parametrize("tools, choice", [
    ([PLACE], "required"),
    ([PLACE, COUNT], "required"),
    ([COUNT, PLACE], {"type": "function", "function": {"name": "place"}}),
])
def test_a_functions_refs_point_into_its_own_parameters(tools, choice):
    schema = parse_tools({"tools": tools, "tool_choice": choice}).call_schema(HERMES)
    grammar_for_schema(schema, "tools")  # compiles: every pointer exists
    call = json.loads(schema)
    jsonschema.validate({"name": "place", "arguments": {"where": {"city": "Oslo"}}}, call)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "place", "arguments": {"where": 3}}, call)
    if len(tools) == 2 and choice == "required":
        jsonschema.validate({"name": "count", "arguments": {"n": 2, "more": [{"n": 1}]}}, call)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"name": "count", "arguments": {"n": {"city": "Oslo"}}}, call)


def test_only_references_are_rebased():
    schema = {"$ref": "#/$defs/a", "properties": {"$ref": {"const": {"$ref": "#/x"}}},
              "enum": [{"$ref": "#"}], "$defs": {"a": {"$ref": "#"}},
              "items": {"$ref": "https://example.com/s"}}
    assert rebase_refs(schema, "#/p") == {
        "$ref": "#/p/$defs/a", "properties": {"$ref": {"const": {"$ref": "#/x"}}},
        "enum": [{"$ref": "#"}], "$defs": {"a": {"$ref": "#/p"}},
        "items": {"$ref": "https://example.com/s"}}


# --- over HTTP: the refusal names the tool -----------------------------------------------

pytestmark = pytest.mark.django_db


@pytest.fixture
def auth(django_user_model, settings) -> dict:
    settings.DEBUG = False
    limiter.reset()
    user = django_user_model.objects.create_user("toolsmith")
    return {"Authorization": f"Bearer {services.api_key_create(user=user)[1]}"}


MISSING = function("lookup", {"type": "object", "properties": {"a": {"$ref": "#/$defs/gone"}},
                              "required": ["a"]})
ENDLESS = function("nest", {"type": "object", "properties": {"c": {"$ref": "#"}},
                            "required": ["c"]})


@pytest.mark.parametrize("tools, index, says", [
    ([MISSING], 0, "gone"),
    ([PLACE, ENDLESS], 1, "no JSON value"),
])
def test_a_forced_tool_whose_parameters_we_cannot_enforce_is_refused_by_name(
        client, auth, tools, index, says):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Go."}], "tools": tools,
            "tool_choice": "required"}
    response = client.post("/v1/chat/completions", json.dumps(body), "application/json",
                           headers=auth)
    assert response.status_code == 400, response.content[:500]
    error = response.json()["error"]
    assert error["param"] == f"tools[{index}].function.parameters"
    assert error["code"] == "invalid_json_schema" and says in error["message"]
    assert "response_format" not in error["message"]
