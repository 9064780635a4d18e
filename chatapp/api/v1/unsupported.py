"""Chat-completions fields this server does not honour: refused, never silently ignored.

A client that sends `functions` and gets a 200 believes it got a call. So each field
below that changes what is generated, or what the reply carries, is a 400
(`unsupported_parameter`, naming the field) unless its value asks for nothing beyond what
we do anyway: null, or the "neutral" value listed (`presence_penalty: 0`, `functions: []`,
...). Stock SDKs send neither null nor these fields
unless the caller set them, so they keep working.

Ignored on purpose, because they do not change the reply: `metadata`, `service_tier`,
`prompt_cache_key` and `prompt_cache_retention` (our prefix cache needs no hint),
`safety_identifier` (like `user`). Names OpenAI does not define are ignored too, as
OpenAI-compatible servers do, except the common sampling extensions of other servers
(`top_k`, `min_p`, `repetition_penalty`), which would change the reply.

To implement a field, delete its entry here and parse it in parsing.py.
"""

from __future__ import annotations

from collections.abc import Callable

from chatapp.api.errors import invalid


def _never(value: object) -> bool:
    return False


def _equals(*neutral: object) -> Callable[[object], bool]:
    # `False == 0` in Python: compare types too, so `logprobs: 0` is not taken for false.
    return lambda value: any(type(value) is type(n) and value == n for n in neutral)


def _zero(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value == 0


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
    "store": _equals(False),
    # Sampling we do not apply.
    "logit_bias": _equals({}),
    "frequency_penalty": _zero,
    "presence_penalty": _zero,
    "top_k": _equals(-1, 0),
    "min_p": _zero,
    "repetition_penalty": _equals(1, 1.0),
}


def refuse_unsupported(data: dict) -> None:
    """OpenAIError(400) for the first field present that we would not honour."""
    for name, is_neutral in UNSUPPORTED.items():
        value = data.get(name)
        if value is not None and not is_neutral(value):
            raise invalid(
                f"'{name}' is not supported by this server; remove it from the request.",
                name, "unsupported_parameter",
            )
