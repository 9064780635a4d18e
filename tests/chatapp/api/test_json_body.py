"""The one decoder of untrusted JSON (chatapp.api.json_body): every refusal is a
JSONBodyError with a message fit to show, never a RecursionError or a silent guess."""

from __future__ import annotations

import pytest

from chatapp.api.json_body import JSONBodyError, loads, nesting_depth
from chatapp.echo import ECHO_MAX_CHARS, quoted


def refused(raw, **limits) -> JSONBodyError:
    with pytest.raises(JSONBodyError) as info:
        loads(raw, **limits)
    assert info.value.message
    return info.value


@pytest.mark.parametrize("raw", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    b"[" * 100_000,  # truncated as well as deep
])
def test_deep_nesting_is_refused_not_a_recursion_error(raw):
    assert "deeper than 32" in refused(raw).message


def test_the_depth_limit_is_exact_and_a_setting(settings):
    assert loads(b"[" * 32 + b"]" * 32) is not None
    refused(b"[" * 33 + b"]" * 33)
    settings.REQUEST_JSON_MAX_DEPTH = 3
    assert loads(b'{"a": [[1]]}') == {"a": [[1]]}
    refused(b'{"a": [[[1]]]}')


def test_brackets_inside_strings_do_not_count():
    text = '{"a": "' + "[{" * 1000 + '\\"[[[", "b": ["]]]]"]}'
    assert nesting_depth(text.encode()) == 2
    assert loads(text)["b"] == ["]]]]"]


def test_size_limit_before_decoding(settings):
    error = refused(b'{"a": "' + b"x" * 100 + b'"}', max_bytes=50)
    assert error.too_large
    settings.REQUEST_JSON_MAX_BYTES = 10
    assert refused('{"a": "é é é"}').too_large  # a str is measured as UTF-8
    assert loads('{"a": 1}') == {"a": 1}


@pytest.mark.parametrize("raw, words", [
    (b'{"a": NaN}', "NaN"),
    (b'{"a": Infinity}', "Infinity"),
    (b"[-Infinity]", "Infinity"),
    (b"[1e999]", "too large"),
    (b"[" + b"9" * 5000 + b"]", "too many digits"),
    (b'{"model": "a", "model": "b"}', "appears twice"),
    (b"\xff\xfe{}", "UTF-8"),
    (b'{"a": "\xc3"}', "UTF-8"),
    (b"", "empty"),
    (b"  \n ", "empty"),
    (b'{"a": ', "malformed"),
    (b"{'a': 1}", "malformed"),
    (b"[1, 2,]", "malformed"),
])
def test_what_json_does_not_allow_is_refused(raw, words):
    assert words in refused(raw).message


def test_a_repeated_key_is_quoted_briefly():
    key = "k" * 100_000
    message = refused(f'{{"{key}": 1, "{key}": 2}}').message
    assert len(message) < 200


def test_plain_documents_pass():
    assert loads(b'{"a": [1, 2.5, "x", null, true], "b": {"c": -0.0}}') == {
        "a": [1, 2.5, "x", None, True], "b": {"c": -0.0}}
    assert loads('"text"') == "text"
    assert loads(b"123") == 123


def test_quoted_bounds_any_value():
    assert quoted("gpt-17") == "'gpt-17'"
    for value in ("x" * 1_000_000, ["y" * 1000] * 1000, {"z" * 1000: ["w"] * 1000}):
        assert len(quoted(value)) <= ECHO_MAX_CHARS + 3
