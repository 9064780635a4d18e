"""Tools in a prompt, as each model family was trained to see them. A chat format names
its convention in its front matter (`tool_calls = "hermes"`, `"llama3"` or `"gemma"`):

- **hermes** (ChatML models: SmolLM2, Qwen2, Qwen3; the Hermes and Qwen2.5 templates'
  convention): the functions are listed in the system message, one JSON signature a
  line, inside <tools></tools>; a call is the assistant's
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; a result comes back
  as a user turn `<tool_response>\\n...\\n</tool_response>`.
- **llama3** (Meta's JSON tool calling of Llama 3.1+, tools in the system message): a
  call is the assistant's whole reply `{"name": ..., "parameters": {...}}`; a result is
  an `ipython` turn.
- **gemma** (Gemma 3 has no tool tokens; Google's function-calling guide prompts for
  JSON): the functions are listed as JSON in the system text, a call is the reply
  `{"name": ..., "parameters": {...}}` (one a line for several; a ```json fence around
  them is accepted), and a result comes back in a user turn inside a ```tool_output
  fence, the block Google's agent guide uses for results.

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


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict


class Hermes:
    """Calls inside <tool_call> tags, results inside <tool_response> in a user turn."""

    name = "hermes"
    arguments_key = "arguments"
    result_role = "user"
    # What a forced call's reply starts with: put in the prompt, the JSON generated after.
    opening = CALL_OPEN + "\n"

    def tools_text(self, tools: Sequence[Mapping]) -> str:
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

    def system_with_tools(self, system: str | None, tools: Sequence[Mapping]) -> str:
        return f"{system}\n\n{self.tools_text(tools)}" if system else self.tools_text(tools)

    def call_text(self, name: str, arguments: object) -> str:
        """One call as the model writes it (`arguments` parsed: a dict)."""
        return f"{CALL_OPEN}\n{_dumps({'name': name, self.arguments_key: arguments})}\n{CALL_CLOSE}"

    def response_text(self, content: str) -> str:
        """A tool's result, as the turn of `result_role` that carries it."""
        return f"<tool_response>\n{content}\n</tool_response>"

    def forced_text(self, generated: str) -> str:
        """A forced call's whole text from what was generated after `opening`."""
        return f"{CALL_OPEN}\n{generated.strip()}\n{CALL_CLOSE}"

    def _call(self, data: object, names: Sequence[str]) -> ParsedCall | None:
        if not (isinstance(data, dict) and data.get("name") in names
                and isinstance(data.get(self.arguments_key, {}), dict)):
            return None
        return ParsedCall(data["name"], data.get(self.arguments_key, {}))

    def parse_calls(self, text: str, names: Sequence[str]) -> tuple[str, list[ParsedCall]]:
        """(the text before the first call, the calls) of a reply; a block that is not a
        call of one of `names` with an object of arguments leaves the text as it was."""
        calls = []
        for match in _CALL.finditer(text):
            try:
                call = self._call(json.loads(match.group(1)), names)
            except ValueError:
                call = None
            if call is None:
                return text, []
            calls.append(call)
        if not calls:
            return text, []
        return text[: text.index(CALL_OPEN)].strip(), calls

    def held_back(self, text: str) -> int:
        """How much of a streaming reply's text may be sent: up to a call's opening tag,
        or up to what could still become one."""
        at = text.find(CALL_OPEN)
        if at >= 0:
            return at
        for n in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
            if CALL_OPEN.startswith(text[-n:]):
                return len(text) - n
        return len(text)


class Llama3(Hermes):
    """A call is the whole reply, `{"name": ..., "parameters": {...}}`; results are
    `ipython` turns; the functions are listed in the system message."""

    name = "llama3"
    arguments_key = "parameters"
    result_role = "ipython"
    opening = ""

    def tools_text(self, tools: Sequence[Mapping]) -> str:
        signatures = "\n\n".join(_dumps(tool) for tool in tools)
        return (
            "You have access to the following functions. To call a function, respond with "
            "only a JSON for a function call with its proper arguments, in the format "
            '{"name": function name, "parameters": dictionary of argument name and its '
            "value}. Do not use variables.\n\n" + signatures
        )

    def call_text(self, name: str, arguments: object) -> str:
        return _dumps({"name": name, self.arguments_key: arguments})

    def response_text(self, content: str) -> str:
        return content

    def forced_text(self, generated: str) -> str:
        return generated.strip()

    def parse_calls(self, text: str, names: Sequence[str]) -> tuple[str, list[ParsedCall]]:
        body = text.strip().removeprefix("<|python_tag|>")
        try:
            call = self._call(json.loads(body), names)
        except ValueError:
            call = None
        return ("", [call]) if call is not None else (text, [])

    def held_back(self, text: str) -> int:
        # A reply that starts as JSON may be a call: none of it is sent until the end.
        return 0 if text.lstrip().startswith(("{", "<|python_tag|>")) else len(text)


class Gemma(Llama3):
    """Google's JSON prompt for Gemma 3: calls are the reply, one JSON object a line;
    results are user turns holding a ```tool_output block."""

    name = "gemma"
    result_role = "user"
    # What a reply that may be a call starts with: it is held back until it is complete.
    _CALL_STARTS = ("{", "```json", "```tool_code")
    _FENCE = re.compile(r"\A```(?:json|tool_code)?\s*\n(.*?)\n?```\Z", re.DOTALL)

    def tools_text(self, tools: Sequence[Mapping]) -> str:
        signatures = ",\n".join(_dumps(tool) for tool in tools)  # a JSON array, a tool a line
        return (
            "You have access to functions. If you decide to invoke any of the function(s), "
            "you MUST put it in the format of\n"
            '{"name": function name, "parameters": dictionary of argument name and its value}'
            "\n\nYou SHOULD NOT include any other text in the response if you call a "
            f"function\n[\n{signatures}\n]"
        )

    def response_text(self, content: str) -> str:
        return f"```tool_output\n{content}\n```"

    def parse_calls(self, text: str, names: Sequence[str]) -> tuple[str, list[ParsedCall]]:
        body = text.strip()
        fenced = self._FENCE.match(body)
        body = fenced.group(1).strip() if fenced else body
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(body):
            try:
                data, end = decoder.raw_decode(body, at)
            except ValueError:
                return text, []
            found = data if isinstance(data, list) else [data]
            parsed = [self._call(item, names) for item in found]
            if not found or None in parsed:
                return text, []
            calls += parsed
            at = len(body) - len(body[end:].lstrip())
        return ("", calls) if calls else (text, [])

    def held_back(self, text: str) -> int:
        start = text.lstrip()
        if not start:
            return len(text)
        maybe = any(start.startswith(s) or s.startswith(start) for s in self._CALL_STARTS)
        return 0 if maybe else len(text)


CONVENTIONS = {c.name: c for c in (Hermes(), Llama3(), Gemma())}


def convention_for(chat_format) -> Hermes:
    """The tool convention a chat format names (hermes where it names none)."""
    return CONVENTIONS[getattr(chat_format, "tool_calls", "hermes")]


# The ChatML models' convention, for callers without a chat format at hand.
HERMES = CONVENTIONS["hermes"]
