"""`tools`, `tool_choice`, `parallel_tool_calls` and tool-call history on /v1, checked
field by field (400s naming the field), and the messages turned into prompt turns by the
prompt manager's convention (chatapp.prompts.tools)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from chatapp.api.errors import OpenAIError, invalid
from chatapp.echo import quoted
from chatapp.prompts import tools as convention_module
from chatapp.prompts.services import content_text

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
MAX_TOOLS = 128


def _bad(param: str, problem: str, code: str = "invalid_value") -> OpenAIError:
    return invalid(f"'{param}' {problem}", param, code)


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[dict, ...]  # {"type": "function", "function": {...}}, as sent
    choice: str  # "auto" | "none" | "required" | "named"
    name: str | None = None  # the function a named choice asks for
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def active(self) -> bool:
        """The model is offered the tools (and its reply is read for calls)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """A call must come (required, or named): its JSON is constrained by a grammar."""
        return self.active and self.choice in ("required", "named")

    def forced_tools(self) -> list[tuple[int, dict]]:
        """(index in `tools`, function) of each function a forced choice may call."""
        return [(i, t["function"]) for i, t in enumerate(self.tools)
                if self.choice == "required" or t["function"]["name"] == self.name]

    def call_schema(self, convention: convention_module.Hermes) -> str:
        """The JSON Schema of the one call a forced choice produces, as `convention`
        writes it: a function's name and arguments matching that function's parameters.
        A function's local `$ref`s ("#/$defs/...") keep pointing into its own parameters,
        wherever those sit in the call's schema."""
        options = [f for _, f in self.forced_tools()]
        key = convention.arguments_key
        at = ["#/properties/" + pointer_token(key)] if len(options) == 1 else [
            f"#/anyOf/{j}/properties/{pointer_token(key)}" for j in range(len(options))]
        variants = [{
            "type": "object",
            "properties": {"name": {"const": f["name"]},
                           key: rebase_refs(f.get("parameters") or {"type": "object"}, base)},
            "required": ["name", key], "additionalProperties": False,
        } for f, base in zip(options, at, strict=True)]
        return json.dumps(variants[0] if len(variants) == 1 else {"anyOf": variants})


def pointer_token(name: str) -> str:
    """`name` as one token of a JSON pointer (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")


# Keywords whose values are JSON data, not schemas: a "$ref" in them is not a reference.
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def rebase_refs(schema: object, base: str) -> object:
    """`schema` with every local `$ref` ("#" or "#/...") made to point at the same place
    once the schema sits at JSON pointer `base` of a larger document."""
    if isinstance(schema, list):
        return [rebase_refs(s, base) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for name, value in schema.items():
        if name == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[name] = base + value[1:]
        elif name in DATA_KEYWORDS:
            out[name] = value
        elif name in ("properties", "patternProperties", "$defs", "definitions") \
                and isinstance(value, dict):
            # Names, then schemas: a property may be called "$ref" or "const".
            out[name] = {k: rebase_refs(v, base) for k, v in value.items()}
        else:
            out[name] = rebase_refs(value, base)
    return out


def _tool(value: object, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(value, dict) or value.get("type") != "function":
        raise _bad(where, 'must be {"type": "function", "function": {...}}.', "invalid_type")
    fn = value.get("function")
    if not isinstance(fn, dict):
        raise _bad(f"{where}.function", "must be an object.", "invalid_type")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _bad(f"{where}.function.name", "must be 1-64 letters, digits, '_' or '-'.")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise _bad(f"{where}.function.description", "must be a string.", "invalid_type")
    params = fn.get("parameters")
    if params is not None and not (isinstance(params, dict) and params.get("type", "object")
                                   == "object"):
        raise _bad(f"{where}.function.parameters", "must be a JSON Schema of an object.")
    return value


def parse_tools(data: dict) -> ToolRequest | None:
    """The request's tools and how they may be used; None without tools."""
    tools = data.get("tools")
    choice = data.get("tool_choice")
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "must be a boolean.", "invalid_type")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise _bad("tool_choice", "is only allowed when 'tools' are given.")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise _bad("tools", f"must be an array of at most {MAX_TOOLS} functions.",
                   "invalid_type")
    tools = [_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise _bad("tools", "must not name a function twice.")
    named = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function")
        named = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(named, str):
            raise _bad("tool_choice", 'must be "auto", "none", "required" or '
                       '{"type": "function", "function": {"name": ...}}.')
        if named not in names:
            raise _bad("tool_choice", f"names {quoted(named)}, which is not in 'tools'.")
        choice = "named"
    elif choice not in ("auto", "none", "required"):
        raise _bad("tool_choice", 'must be "auto", "none", "required" or a named function.')
    return ToolRequest(tuple(tools), choice, named, parallel is not False)


def check_tool_message(msg: dict, where: str) -> None:
    """An assistant message's `tool_calls`, or a `tool` message's `tool_call_id`."""
    if msg.get("role") == "tool":
        if not isinstance(msg.get("tool_call_id"), str) or not msg["tool_call_id"]:
            raise _bad(f"{where}.tool_call_id", "is required for a tool message.",
                       "invalid_type")
        return
    calls = msg.get("tool_calls")
    if calls is None:
        return
    if msg.get("role") != "assistant" or not isinstance(calls, list) or not calls:
        raise _bad(f"{where}.tool_calls", "must be a non-empty array, on an assistant message.",
                   "invalid_type")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(call, dict) and isinstance(call.get("id"), str)
                and call.get("type", "function") == "function" and isinstance(fn, dict)
                and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), str)):
            raise _bad(at, 'must be {"id", "type": "function", "function": {"name", '
                       '"arguments"}} with string values.', "invalid_type")
        try:
            arguments = json.loads(fn["arguments"])
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise _bad(f"{at}.function.arguments", "must be a JSON object, as text.")


def calls_key(call_ids: list[str]) -> str:
    """What a reply that made these calls is remembered by (its text may come back
    re-serialised; the ids come back as they were)."""
    return "\x00tool_calls:" + "\x00".join(call_ids)


def prompt_turns(messages: list[dict], tools: ToolRequest | None,
                 convention: convention_module.Hermes = convention_module.HERMES,
                 ) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(the (role, text) turns for the prompt builder, tools, calls and results written
    by the chat format's `convention`, {an assistant turn's text: the key its generated
    ids are remembered by} for turns that made tool calls)."""
    turns: list[tuple[str, str]] = []
    keys: dict[str, str] = {}
    for msg in messages:  # checked by the parser (chatapp.api.v1.parsing._messages)
        content = content_text(msg.get("content"))
        if msg.get("role") == "tool":
            turns.append((convention.result_role, convention.response_text(content)))
            continue
        if msg.get("tool_calls"):
            calls = [convention.call_text(c["function"]["name"],
                                          json.loads(c["function"]["arguments"]))
                     for c in msg["tool_calls"]]
            text = "\n".join(([content] if content else []) + calls)
            keys[text] = calls_key([c["id"] for c in msg["tool_calls"]])
            turns.append(("assistant", text))
            continue
        # "developer" is OpenAI's newer name for the system role.
        turns.append(("system" if msg["role"] == "developer" else msg["role"], content))
    if tools is not None and tools.active:
        if turns and turns[0][0] == "system":
            turns[0] = ("system", convention.system_with_tools(turns[0][1], tools.tools))
        else:
            turns.insert(0, ("system", convention.system_with_tools(None, tools.tools)))
    return turns, keys
