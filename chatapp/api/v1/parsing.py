"""The body of POST /v1/chat/completions, checked field by field.

Wrong types and out-of-range values become OpenAIError(400) naming the field, so a
client sees what it got wrong; nothing malformed reaches the prompt builder or the
engine. The body is decoded by the one bounded JSON decoder (chatapp.api.json_body:
depth, size, NaN, repeated keys). Fields we would not honour (audio, ...) and names we
do not know are refused, never ignored: see unsupported.py.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from django.conf import settings

from chatapp.api.errors import OpenAIError, invalid
from chatapp.api.json_body import JSONBodyError, loads
from chatapp.api.v1.tool_params import (
    ToolRequest,
    check_tool_message,
    parse_tools,
    prompt_turns,
)
from chatapp.api.v1.unsupported import refuse_unsupported
from chatapp.echo import quoted
from chatapp.prompts.errors import InvalidMessages
from chatapp.prompts.services import content_text

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20  # OpenAI's bound, and the engine's (inference.sampling_params)
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
# `json_object`: any JSON object, as a schema, so both modes take one path to the engine.
JSON_OBJECT_SCHEMA = '{"type":"object"}'


@dataclass(kw_only=True)
class SamplingRequest:
    """What chat and text completions both take, parsed alike: the stream, the sampling
    and who asks."""

    stream: bool = False
    include_usage: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> bias
    # vLLM's: go on past the end tokens; ban them until the reply holds min_tokens.
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    user: str | None = None
    cache_salt: str | None = None
    # Our extension: usage.prefix_cache, why the prefix-cache match ended where it did.
    prefix_cache_receipt: bool = False


@dataclass
class CompletionRequest(SamplingRequest):
    model: str
    messages: list[dict]
    max_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token, with logprobs
    # response_format json_object / json_schema: the JSON Schema the reply must match, as
    # JSON text (key order kept: it is the order properties are generated in). None: text.
    json_schema: str | None = None
    tools: ToolRequest | None = None
    # "auto": history longer than the context loses its oldest whole turns (the chat's
    # policy, chatapp.prompts.history); "disabled" (OpenAI's default): a 400 instead.
    truncation: str = "disabled"

    def turns(self, convention) -> tuple[list[tuple[str, str]], dict[str, str]]:
        """The messages as (role, text), parts joined, "developer" as "system", tools,
        calls and results as the chat format's tool `convention` writes them
        (chatapp.prompts.tools); and {an assistant turn's text: the key its ids are
        remembered by}, for turns that made tool calls (their arguments may come back
        re-serialised)."""
        return prompt_turns(self.messages, self.tools, convention)


def check_content_type(content_type: str | None) -> None:
    """JSON only: application/json or a +json type. A missing type is read as JSON, as
    minimal clients omit it; forms and uploads (multipart/form-data) are a 415."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise OpenAIError(
            415, f"Unsupported Content-Type {quoted(media)}: send the request as JSON with "
            "'Content-Type: application/json'.", code="unsupported_media_type",
        )


def parse_json(body: bytes) -> dict:
    try:
        data = loads(body)
    except JSONBodyError as exc:
        if exc.too_large:
            raise OpenAIError(413, "The request body is too large.",
                              code="request_too_large") from None
        raise invalid(
            f"We could not parse the JSON body of your request: {exc.message}", None,
            "invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.")
    return data


def _bad(param: str, problem: str, code: str = "invalid_value") -> OpenAIError:
    """A 400 that names the field: "'param' problem"."""
    return invalid(f"'{param}' {problem}", param, code)


def _number(data: dict, name: str, default: float, lo: float, hi: float, lo_open=False) -> float:
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(name, "must be a number.", "invalid_type")
    if value > hi or value < lo or (lo_open and value == lo):
        bracket = "(" if lo_open else "["
        raise _bad(name, f"must be in {bracket}{lo:g}, {hi:g}].")
    return float(value)


def _int(data: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, "must be an integer.", "invalid_type")
    if value < lo or (hi is not None and value > hi):
        upper = f" and at most {hi}" if hi is not None else ""
        raise _bad(name, f"must be at least {lo}{upper}.")
    return value


def _bool(data: dict, name: str, container: str = "") -> bool:
    value = data.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(container + name, "must be a boolean.", "invalid_type")
    return value


def _optional_str(data: dict, name: str, max_len: int) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(name, "must be a string.", "invalid_type")
    if len(value) > max_len:
        raise _bad(name, f"is longer than {max_len} characters.")
    return value


def _messages(value) -> list[dict]:
    if not isinstance(value, list):
        raise _bad("messages", "must be an array of message objects.", "invalid_type")
    if not value:
        raise _bad("messages", "must not be empty.", "empty_array")
    # Counted before any message is looked at: each costs the prompt builder work.
    if len(value) > settings.API_MAX_MESSAGES:
        raise _bad("messages", f"takes at most {settings.API_MAX_MESSAGES} messages; got "
                   f"{len(value)}.", "array_above_max_length")
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _bad(where, "must be an object.", "invalid_type")
        role = msg.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role",
                       f"must be one of {', '.join(ROLES)}; got {quoted(role)}.")
        check_tool_message(msg, where)
        content = msg.get("content")
        if content is None and role != "assistant":
            raise _bad(f"{where}.content", "is required.", "invalid_type")
        try:  # the text-part rule is the prompt manager's
            content_text(content, f"{where}.content")
        except InvalidMessages as exc:
            raise invalid(str(exc), exc.param, exc.code) from None
    if value[-1].get("role") == "assistant":
        raise invalid(
            "The last message must not be an assistant message: there is nothing to reply to.",
            f"messages[{len(value) - 1}].role",
            "invalid_value",
        )
    return value


def _stop(value) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", "must be a string or an array of strings.", "invalid_type")
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise _bad("stop", f"takes at most {MAX_STOP} non-empty strings.")
    return stops


def _model(data: dict) -> str:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "is required and must be a string.", "invalid_type")
    return model


def _stream(data: dict) -> tuple[bool, dict]:
    """`stream`, and `stream_options` ({} when absent), which only a stream may send."""
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", "must be an object.", "invalid_type")
    stream = _bool(data, "stream")
    if options is not None and not stream:
        raise _bad("stream_options", "is only allowed when 'stream' is true.")
    return stream, options or {}


def parse_completion_request(data: dict) -> CompletionRequest:
    refuse_unsupported(data)
    model = _model(data)
    messages = _messages(data.get("messages"))
    stream, options = _stream(data)
    max_tokens = _int(data, "max_tokens", 1)
    max_completion = _int(data, "max_completion_tokens", 1)
    return CompletionRequest(
        model=model,
        messages=messages,
        stream=stream,
        include_usage=_bool(options, "include_usage", "stream_options."),
        # The newer name wins; both are accepted because clients send either.
        max_tokens=max_completion if max_completion is not None else max_tokens,
        temperature=_number(data, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(data, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        n=_int(data, "n", 1, settings.API_MAX_N) or 1,
        stop=_stop(data.get("stop")),
        seed=_int(data, "seed", -(2**63), 2**63 - 1),
        user=_optional_str(data, "user", 256),
        cache_salt=_optional_str(data, "cache_salt", 256),
        prefix_cache_receipt=_bool(data, "prefix_cache_receipt"),
        truncation=_truncation(data.get("truncation")),
        **_structure(data),
        **_logprobs(data),
        **_sampling(data),
    )


TRUNCATION = ("auto", "disabled")


def _truncation(value) -> str:
    """`truncation`, the OpenAI Responses API's name: "auto" or "disabled" (default)."""
    if value is None:
        return "disabled"
    if value not in TRUNCATION:
        raise _bad("truncation", f"must be one of {', '.join(TRUNCATION)}; got {quoted(value)}.")
    return value


def _structure(data: dict) -> dict:
    """response_format and tools: a forced tool call (required, or a named function) is
    generated under its call's schema (chatapp.api.v1.completions.prepare), so it cannot
    be combined with another format."""
    schema = _response_format(data.get("response_format"))
    tools = parse_tools(data)
    if tools is not None and tools.forced and schema is not None:
        raise invalid("'response_format' cannot be combined with a required or named "
                      "tool_choice.", "response_format", "invalid_value")
    return {"json_schema": schema, "tools": tools}


def _logprobs(data: dict) -> dict:
    """`logprobs` and `top_logprobs` (0-20 alternatives a token), the second only with
    the first, as OpenAI has them."""
    wanted = _bool(data, "logprobs")
    top = _int(data, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise _bad("top_logprobs", "needs 'logprobs' set to true.")
    return {"logprobs": wanted, "top_logprobs": top or 0}


def _format_error(path: str, problem: str, code: str = "invalid_value") -> OpenAIError:
    """A 400 about part of response_format: the message names the part, the param is
    response_format (OpenAI's param for every problem with it)."""
    return invalid(f"'{path}' {problem}", "response_format", code)


def _response_format(value) -> str | None:
    """`response_format`: text (None), json_object, or json_schema with a `name` and a
    `schema` object; `strict` may be true or false, and either way the schema is enforced
    (a schema we cannot enforce is refused: chatapp.api.v1.completions.prepare)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _format_error("response_format", "must be an object.", "invalid_type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    if kind != "json_schema":
        raise _format_error("response_format.type", "must be one of text, json_object, "
                            f"json_schema; got {quoted(kind)}.")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise _format_error("response_format.json_schema", "must be an object with a "
                            "'name' and a 'schema'.", "invalid_type")
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise _format_error("response_format.json_schema.name", "is required: 1-64 letters, "
                            "digits, underscores or dashes.")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise _format_error("response_format.json_schema.strict", "must be a boolean.",
                            "invalid_type")
    if spec.get("description") is not None and not isinstance(spec["description"], str):
        raise _format_error("response_format.json_schema.description", "must be a string.",
                            "invalid_type")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise _format_error("response_format.json_schema.schema", "is required and must be a "
                            "JSON Schema object.", "invalid_type")
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


MAX_LOGIT_BIAS = 1024  # entries, the engine's bound (inference.sampling_params)


def _sampling(data: dict) -> dict:
    """Penalties (OpenAI's ranges), logit_bias, and the common extensions top_k (-1 or 0:
    off), min_p, repetition_penalty (1: off), ignore_eos and min_tokens, as vLLM and
    llama.cpp take them."""
    top_k = _int(data, "top_k", -1, 2**31 - 1)
    return {
        "ignore_eos": _bool(data, "ignore_eos"),
        "min_tokens": _int(data, "min_tokens", 0, 2**31 - 1) or 0,
        "presence_penalty": _number(data, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _number(data, "frequency_penalty", 0.0, -2.0, 2.0),
        "repetition_penalty": _number(data, "repetition_penalty", 1.0, 0.0, 2.0, lo_open=True),
        "min_p": _number(data, "min_p", 0.0, 0.0, 1.0),
        "top_k": max(top_k or 0, 0),
        "logit_bias": _logit_bias(data.get("logit_bias")),
    }


def _logit_bias(value) -> dict[int, float]:
    """`logit_bias`: {"token id": bias in [-100, 100]}, ids as JSON keys (strings) of
    decimal integers; whether an id is in the vocabulary is the engine's check."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad("logit_bias", "must be an object mapping token ids to numbers.",
                   "invalid_type")
    if len(value) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"takes at most {MAX_LOGIT_BIAS} tokens.")
    bias = {}
    for key, number in value.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 9:
            raise _bad("logit_bias", f"keys must be token ids (decimal integers); got "
                       f"{quoted(key)}.")
        if (isinstance(number, bool) or not isinstance(number, int | float)
                or not math.isfinite(number) or not -100 <= number <= 100):
            raise _bad("logit_bias", f"values must be numbers in [-100, 100]; got "
                       f"{quoted(number)} for token {key}.")
        bias[int(key)] = float(number)
    return bias
