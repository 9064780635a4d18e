"""Tools in a prompt, as text inside the chat format's own roles (the convention of the
Hermes and Qwen2.5 templates, which small ChatML models have seen):

- the functions are listed in the system message, one JSON signature a line, inside
  <tools></tools>, with how to call them;
- a call is the assistant's `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- a result comes back as a user turn `<tool_response>\\n...\\n</tool_response>`.

Everything is serialised one way (compact JSON, the client's key order), so the same
tools give the same system segment and the same blocks on every request. A reply's
calls are parsed back from its text; the ids it was generated as are remembered by the
API (keyed by the calls' ids), so a client that re-serialises `arguments` still gets a
prompt that extends the earlier one token for token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.DOTALL)


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def tools_text(tools: Sequence[Mapping]) -> str:
    """The block appended to the system message that lists `tools` (OpenAI's shape)."""
    signatures = "\n".join(_dumps(tool) for tool in tools)
    return (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{signatures}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        f"{CALL_OPEN}\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        f"{CALL_CLOSE}"
    )


def system_with_tools(system: str | None, tools: Sequence[Mapping]) -> str:
    return f"{system}\n\n{tools_text(tools)}" if system else tools_text(tools)


def call_text(name: str, arguments: object) -> str:
    """One call as the model writes it (`arguments` parsed: a dict)."""
    return f"{CALL_OPEN}\n{_dumps({'name': name, 'arguments': arguments})}\n{CALL_CLOSE}"


def response_text(content: str) -> str:
    """A tool's result, as the user turn that carries it."""
    return f"<tool_response>\n{content}\n</tool_response>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict


def parse_calls(text: str, names: Sequence[str]) -> tuple[str, list[ParsedCall]]:
    """(the text before the first call, the calls) of a reply; a block that is not a call
    of one of `names` with an object of arguments leaves the text as it was."""
    calls = []
    for match in _CALL.finditer(text):
        try:
            data = json.loads(match.group(1))
        except ValueError:
            return text, []
        if not (isinstance(data, dict) and data.get("name") in names
                and isinstance(data.get("arguments", {}), dict)):
            return text, []
        calls.append(ParsedCall(data["name"], data.get("arguments", {})))
    if not calls:
        return text, []
    return text[: text.index(CALL_OPEN)].strip(), calls


def held_back(text: str) -> int:
    """How much of a streaming reply's text may be sent: up to a call's opening tag, or
    up to what could still become one."""
    at = text.find(CALL_OPEN)
    if at >= 0:
        return at
    for n in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-n:]):
            return len(text) - n
    return len(text)
