"""The body of POST /v1/responses, checked field by field.

The Responses API's own shapes (`input` items, flat function tools, `text.format`,
`max_output_tokens`) are turned into their chat-completions equivalents and checked by
the one chat-completions parser (chatapp.api.v1.parsing), so both endpoints take the same
values and refuse the same ones; a refusal names the Responses field. Fields we do not
honour, and names we do not know, are refused as on chat completions (unsupported.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from chatapp.api.errors import OpenAIError, invalid
from chatapp.api.v1.parsing import CompletionRequest, _bad, parse_completion_request
from chatapp.api.v1.unsupported import IGNORED, refuse_unsupported
from chatapp.echo import quoted

HONOURED = frozenset({
    "model", "input", "instructions", "previous_response_id", "store", "stream",
    "max_output_tokens", "temperature", "top_p", "text", "tools", "tool_choice",
    "parallel_tool_calls", "truncation", "metadata", "user",
    # Ours, as on chat completions.
    "cache_salt", "prefix_cache_receipt",
})


def _neutral(*values: object) -> Callable[[object], bool]:
    # Types compared too: `False == 0` in Python.
    return lambda value: any(type(value) is type(v) and value == v for v in values)


# Without effect here: obfuscation pads deltas against side channels over shared networks.
RESPONSES_IGNORED = IGNORED | {"stream_options"}

UNSUPPORTED: dict[str, Callable[[object], bool]] = {
    "background": _neutral(False),
    "background_options": _neutral(),
    "conversation": _neutral(),
    "context_management": _neutral(),
    "include": _neutral([]),
    "max_tool_calls": _neutral(),
    "prompt": _neutral(),
    "reasoning": _neutral({}),
    "top_logprobs": _neutral(0),
    "moderation": _neutral(),
    "access_programs": _neutral(),
    "image": _neutral(),
}

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
FUNCTION_KEYS = ("type", "name", "description", "parameters", "strict")
MAX_ID = 64
MAX_METADATA = 16  # OpenAI's bounds on metadata: keys, key length, value length
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
# The chat parser's field names, as the Responses API calls them.
_PARAMS = (
    # Input items and messages do not line up one to one (calls join their turn).
    (re.compile(r"^messages.*"), "input"),
    (re.compile(r"^max_completion_tokens"), "max_output_tokens"),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^tools(\[\d+\])\.function"), r"tools\1"),
)


@dataclass
class ResponseRequest:
    model: str
    # This turn's new messages in chat shape (function calls as assistant tool_calls,
    # their outputs as tool messages); `instructions` are not among them.
    input_messages: list[dict]
    completion: CompletionRequest  # the same request as chat completions takes it
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True  # OpenAI's default
    stream: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    # As the Response object echoes them.
    tools: list[dict] = field(default_factory=list)
    tool_choice: str | dict = "auto"
    text_format: dict = field(default_factory=lambda: {"type": "text"})

    def messages(self, history: list[dict]) -> list[dict]:
        """The whole conversation for the prompt: the instructions, the `history` replayed
        from previous responses, then this turn's input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return system + history + self.input_messages


def responses_param(param: str | None) -> str | None:
    """A chat-completions field name as the Responses API names it."""
    if param is None:
        return None
    for pattern, name in _PARAMS:
        if pattern.match(param):
            return pattern.sub(name, param, count=1)
    return param


def renamed(exc: OpenAIError) -> OpenAIError:
    """`exc` naming the Responses field (its message is kept)."""
    exc.param = responses_param(exc.param)
    return exc


def _unsupported(param: str, what: str) -> OpenAIError:
    return invalid(f"'{param}' {what} is not supported by this server.", param,
                   "unsupported_parameter")


def _text(content: object, where: str) -> str:
    """A message's content: a string, or text parts (input_text, output_text) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "must be a string or an array of content parts.", "invalid_type")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise _bad(at, "must be an object.", "invalid_type")
        kind = part.get("type")
        if kind not in TEXT_PARTS:
            raise _unsupported(f"{at}.type", f"{quoted(kind)}")
        if not isinstance(part.get("text"), str):
            raise _bad(f"{at}.text", "must be a string.", "invalid_type")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: dict, name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise _bad(f"{where}.{name}", "is required and must be a string.", "invalid_type")
    return value


def input_messages(value: object) -> list[dict]:
    """`input` as chat messages: a string is one user message; items are messages,
    function calls (joined to the assistant turn they follow, as the model wrote them in
    one reply) and function call outputs (tool messages)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _bad("input", "must be a string or a non-empty array of items.", "invalid_type")
    messages: list[dict] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "must be an object.", "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise _bad(f"{where}.role", f"must be one of {', '.join(ROLES)}; got "
                           f"{quoted(role)}.")
            messages.append({"role": role, "content": _text(item.get("content"),
                                                            f"{where}.content")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where),
                                 "arguments": _string(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": _text(item.get("output"), f"{where}.output")})
        else:
            raise _unsupported(f"{where}.type", f"{quoted(kind)}")
    return messages


def _tools(value: object) -> tuple[list[dict] | None, list[dict]]:
    """(the tools in chat shape, as the response echoes them): function tools only."""
    if value is None:
        return None, []
    if not isinstance(value, list):
        raise _bad("tools", "must be an array of function tools.", "invalid_type")
    chat, echo = [], []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(where, "must be an object.", "invalid_type")
        if tool.get("type") != "function":
            raise _unsupported(f"{where}.type", f"{quoted(tool.get('type'))} (only "
                               "'function' tools are)")
        for name, given in tool.items():
            if name not in FUNCTION_KEYS and given is not None:
                raise _unsupported(f"{where}.{name}", "on a function tool")
        fn = {k: tool[k] for k in FUNCTION_KEYS[1:] if tool.get(k) is not None}
        chat.append({"type": "function", "function": fn})
        echo.append({"type": "function", "name": tool.get("name"),
                     "description": tool.get("description"),
                     "parameters": tool.get("parameters"), "strict": tool.get("strict")})
    return chat, echo


def _tool_choice(value: object) -> str | dict | None:
    """`tool_choice` in chat shape: auto, none, required, or {"type": "function", "name"}."""
    if value is None or isinstance(value, str):
        return value  # the chat parser checks the word
    if isinstance(value, dict) and value.get("type") == "function":
        if set(value) - {"type", "name"}:
            raise _bad("tool_choice", 'must be {"type": "function", "name": ...}.')
        return {"type": "function", "function": {"name": value.get("name")}}
    kind = value.get("type") if isinstance(value, dict) else value
    raise _unsupported("tool_choice", f"{quoted(kind)}")


def _text_format(value: object) -> tuple[dict | None, dict]:
    """(`text.format` as a chat response_format, as the response echoes it)."""
    if value is None:
        return None, {"type": "text"}
    if not isinstance(value, dict):
        raise _bad("text", "must be an object.", "invalid_type")
    for name, given in value.items():
        if name != "format" and given is not None:
            raise _unsupported(f"text.{name}", "")
    fmt = value.get("format")
    if fmt is None:
        return None, {"type": "text"}
    if not isinstance(fmt, dict):
        raise _bad("text.format", "must be an object.", "invalid_type")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}, {"type": kind}
    if kind != "json_schema":
        raise _bad("text.format", "'type' must be one of text, json_object, json_schema; got "
                   f"{quoted(kind)}.")
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}, {"type": "json_schema", **spec}


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if (not isinstance(value, dict) or len(value) > MAX_METADATA
            or not all(isinstance(k, str) and len(k) <= MAX_METADATA_KEY
                       and isinstance(v, str) and len(v) <= MAX_METADATA_VALUE
                       for k, v in value.items())):
        raise _bad("metadata", f"must map at most {MAX_METADATA} keys of up to "
                   f"{MAX_METADATA_KEY} characters to strings of up to {MAX_METADATA_VALUE}.")
    return value


def _optional(data: dict, name: str, kind: type, what: str):
    value = data.get(name)
    if value is not None and not isinstance(value, kind):
        raise _bad(name, f"must be {what}.", "invalid_type")
    return value


def parse_response_request(data: dict) -> ResponseRequest:
    """The request, or OpenAIError(400) naming the first field that is wrong."""
    refuse_unsupported(data, HONOURED, RESPONSES_IGNORED, UNSUPPORTED)
    if data.get("input") is None:
        raise _bad("input", "is required.", "invalid_type")
    messages = input_messages(data["input"])
    instructions = _optional(data, "instructions", str, "a string")
    previous = _optional(data, "previous_response_id", str, "a string")
    if previous is not None and not 0 < len(previous) <= MAX_ID:
        raise _bad("previous_response_id", f"must be a response id (at most {MAX_ID} "
                   "characters).")
    store = _optional(data, "store", bool, "a boolean")
    stream = _optional(data, "stream", bool, "a boolean")
    chat_tools, echo_tools = _tools(data.get("tools"))
    response_format, echo_format = _text_format(data.get("text"))
    chat = {"model": data.get("model"), "messages": messages,
            "max_completion_tokens": data.get("max_output_tokens"),
            "tools": chat_tools, "tool_choice": _tool_choice(data.get("tool_choice")),
            "response_format": response_format}
    for name in ("temperature", "top_p", "parallel_tool_calls", "truncation", "user",
                 "cache_salt", "prefix_cache_receipt"):
        chat[name] = data.get(name)
    try:
        completion = parse_completion_request({k: v for k, v in chat.items() if v is not None})
    except OpenAIError as exc:
        raise renamed(exc) from None
    choice = data.get("tool_choice")
    return ResponseRequest(
        model=completion.model, input_messages=messages, completion=completion,
        instructions=instructions, previous_response_id=previous,
        store=True if store is None else store, stream=bool(stream),
        metadata=_metadata(data.get("metadata")), tools=echo_tools,
        tool_choice=choice if choice is not None else "auto", text_format=echo_format,
    )
