"""Which chat-completions fields we read, which we ignore, and which we refuse.

Every field of a body is one of three kinds; anything else is refused:

- HONOURED: read and applied by parsing.py (vLLM's `ignore_eos` and `min_tokens`, and
  our extensions `cache_salt`, `prefix_cache_receipt` and `truncation`, among them).
- IGNORED: sent by OpenAI clients, and without effect on the reply, so accepted and
  ignored: `metadata`, `service_tier`, `prompt_cache_key`, `prompt_cache_options` and
  `prompt_cache_retention` (our prefix cache needs no hint), `safety_identifier` (like
  `user`).
- UNSUPPORTED: OpenAI fields that change what is generated, or what the reply carries,
  which we do not do. A client that sends `functions` and gets a 200 believes it got a
  call, so each is a 400 (`unsupported_parameter`, naming the field) unless its value
  asks for nothing beyond what we do anyway: null, or the "neutral" value listed
  (`functions: []`, `store: false`, ...).

A name in none of them is a 400 `unknown_parameter` naming it (with the nearest known
name, for a typo such as `max_token`): a misspelt field is never silently dropped. Stock
SDKs send only the fields their caller set, so they keep working.

To implement an unsupported field, move it to HONOURED and parse it in parsing.py.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from chatapp.api.errors import invalid
from chatapp.echo import quoted


def _never(value: object) -> bool:
    return False


def _equals(*neutral: object) -> Callable[[object], bool]:
    # `False == 0` in Python: compare types too, so `logprobs: 0` is not taken for false.
    return lambda value: any(type(value) is type(n) and value == n for n in neutral)


HONOURED = frozenset({
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "n", "stop", "seed", "user", "logprobs",
    "top_logprobs", "response_format", "tools", "tool_choice", "parallel_tool_calls",
    # vLLM's, which benchmark clients send.
    "ignore_eos", "min_tokens",
    # Ours.
    "cache_salt", "prefix_cache_receipt", "truncation",
})

IGNORED = frozenset({
    "metadata", "service_tier", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "safety_identifier",
})

UNSUPPORTED: dict[str, Callable[[object], bool]] = {
    # Tool and function calling.
    "functions": _equals([]),
    "function_call": _equals("none"),
    # Output shape and extras.
    "modalities": _equals(["text"]),
    "audio": _never,
    "prediction": _never,
    "web_search_options": _never,
    "reasoning_effort": _never,
    "verbosity": _never,
    "moderation": _never,
    "store": _equals(False),
}

_KNOWN = sorted(HONOURED | IGNORED | set(UNSUPPORTED))


def refuse_unsupported(
    data: dict,
    honoured: frozenset[str] = HONOURED,
    ignored: frozenset[str] = IGNORED,
    unsupported: dict[str, Callable[[object], bool]] | None = None,
) -> None:
    """OpenAIError(400) for the first field present that we would not honour, or do not
    know at all. The sets default to chat completions'; another endpoint passes its own."""
    if unsupported is None:
        unsupported = UNSUPPORTED
    known = _KNOWN if honoured is HONOURED else sorted(honoured | ignored | set(unsupported))
    for name in data:
        if name in honoured or name in ignored:
            continue
        if name in unsupported:
            value = data[name]
            if value is not None and not unsupported[name](value):
                raise invalid(
                    f"'{name}' is not supported by this server; remove it from the request.",
                    name, "unsupported_parameter",
                )
            continue
        label = name if len(name) <= 64 else quoted(name)
        near = difflib.get_close_matches(name[:64], known, n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        raise invalid(f"Unrecognized request argument supplied: {quoted(name)}.{hint}",
                      label, "unknown_parameter")
