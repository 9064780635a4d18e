"""Schemas that admit no finite JSON value are found (and refused) before the grammar
library compiles them into a parser that runs out of its limits mid-reply."""

from __future__ import annotations

import json

import pytest

from inference import InvalidRequestError
from inference.finite_schema import endless_part
from inference.grammar import grammar_for_schema

NODE = {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}

ENDLESS = {
    "a required property of itself": ({"$defs": {"n": NODE}, "$ref": "#/$defs/n"}, "#"),
    "the root's own ref": ({"$ref": "#"}, "#"),
    "after free content": ({"$defs": {"n": NODE}, "type": "object", "properties": {
        "a": {"type": "string"}, "b": {"$ref": "#/$defs/n"}}, "required": ["a", "b"]}, "#"),
    "an array's minimum items": ({"type": "array", "items": {"$ref": "#"}, "minItems": 1},
                                 "#"),
    "two defs requiring each other": ({"$defs": {
        "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
        "b": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/a"}},
    }, "$ref": "#/$defs/a"}, "#"),
    "through allOf": ({"$defs": {"n": {"allOf": [NODE]}}, "$ref": "#/$defs/n"}, "#"),
    "anyOf whose every branch recurses": ({"$defs": {"n": {"anyOf": [
        NODE, {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}]}},
        "$ref": "#/$defs/n"}, "#"),
    # An optional property may be chosen, and then the reply could never end.
    "an optional trap": ({"$defs": {"n": NODE}, "type": "object",
                          "properties": {"b": {"$ref": "#/$defs/n"}}}, "#/$defs/n"),
}

FINITE = {
    "optional recursion": {"$defs": {"n": {"type": "object", "properties": {
        "c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
    "a tree whose children may be none": {"$defs": {"t": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
        "required": ["v", "kids"]}}, "$ref": "#/$defs/t"},
    "a nullable branch": {"$defs": {"n": {"type": "object", "properties": {
        "c": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}}, "required": ["c"]}},
        "$ref": "#/$defs/n"},
    "a type list with a scalar": {"$defs": {"n": {"type": ["object", "null"], "properties": {
        "c": {"$ref": "#/$defs/n"}}, "required": ["c"]}}, "$ref": "#/$defs/n"},
    "no type at all (any value)": {"$defs": {"n": {"properties": {
        "c": {"$ref": "#/$defs/n"}}, "required": ["c"]}}, "$ref": "#/$defs/n"},
    "a plain object": {"type": "object", "properties": {"a": {"type": "string"}},
                       "required": ["a"]},
    "true": True,
}


@pytest.mark.parametrize("name", list(ENDLESS))
def test_a_schema_with_no_finite_value_is_found(name):
    schema, where = ENDLESS[name]
    assert endless_part(schema) == where


@pytest.mark.parametrize("name", list(FINITE))
def test_a_schema_with_finite_values_passes(name):
    assert endless_part(FINITE[name]) is None


@pytest.mark.parametrize("name", list(ENDLESS))
def test_the_grammar_refuses_it_naming_response_format(name):
    schema, _ = ENDLESS[name]
    with pytest.raises(InvalidRequestError) as err:
        grammar_for_schema(json.dumps(schema))
    assert err.value.param == "response_format" and err.value.code == "invalid_json_schema"
    assert "no JSON value can be generated" in str(err.value)


def test_a_long_chain_of_refs_is_checked_without_recursion():
    # Refs chain 20,000 definitions deep, without nesting the document: no recursion limit.
    n = 20_000
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}},
                      "required": ["x"]} for i in range(n)}
    defs[f"d{n}"] = {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}},
                     "required": ["x"]}
    assert endless_part({"$defs": defs, "$ref": "#/$defs/d0"}) == "#"
    defs[f"d{n}"] = {"type": "string"}
    assert endless_part({"$defs": defs, "$ref": "#/$defs/d0"}) is None
