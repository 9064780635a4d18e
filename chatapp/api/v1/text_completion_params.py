"""The body of POST /v1/completions (OpenAI's legacy completions), checked field by field
as chat completions' is (parsing.py): a 400 naming the field for anything wrong, and
fields we would not honour, or do not know, refused (unsupported.py)."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from chatapp.api.v1.parsing import (
    MAX_TOP_LOGPROBS,
    SamplingRequest,
    _bad,
    _bool,
    _int,
    _model,
    _number,
    _optional_str,
    _sampling,
    _stop,
    _stream,
)
from chatapp.api.v1.unsupported import IGNORED, _equals, refuse_unsupported

# OpenAI's default for this endpoint (not chat's API_DEFAULT_MAX_TOKENS).
DEFAULT_MAX_TOKENS = 16

HONOURED = frozenset({
    "model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p",
    "n", "best_of", "stop", "seed", "user", "logprobs", "echo", "presence_penalty",
    "frequency_penalty", "logit_bias",
    # The sampling extensions chat completions take (vLLM's, llama.cpp's).
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
    # Ours, as on chat completions.
    "cache_salt", "prefix_cache_receipt",
})

UNSUPPORTED = {
    # Fill-in-the-middle: text after the completion. Refused whatever the model, not
    # ignored: the completion would not fit the gap.
    "suffix": _equals(""),
}


@dataclass
class TextCompletionRequest(SamplingRequest):
    model: str
    # One entry per prompt of the batch: text, or token ids as sent.
    prompts: list[str | list[int]]
    max_tokens: int = DEFAULT_MAX_TOKENS
    # Alternatives per token in the legacy `logprobs` object (None: no logprobs).
    logprobs: int | None = None
    # The prompt before the completion, in its text and (with logprobs) its tokens.
    echo: bool = False


def _token_ids(value: list, where: str) -> list[int]:
    if not value:
        raise _bad(where, "must not be empty.", "empty_array")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise _bad(where, "must be token ids: integers >= 0.", "invalid_type")
    return value


def _prompts(value) -> list[str | list[int]]:
    """`prompt`: a string, token ids, or a batch of either (at most API_MAX_PROMPTS)."""
    shape = "must be a string, an array of token ids, or an array of either."
    if isinstance(value, str):
        prompts: list = [value]
    elif isinstance(value, list) and value and all(isinstance(p, int) for p in value):
        prompts = [_token_ids(value, "prompt")]
    elif isinstance(value, list) and value:
        prompts = value
    elif isinstance(value, list):
        raise _bad("prompt", "must not be empty.", "empty_array")
    elif value is None:
        raise _bad("prompt", "is required.", "invalid_type")
    else:
        raise _bad("prompt", shape, "invalid_type")
    if len(prompts) > settings.API_MAX_PROMPTS:
        raise _bad("prompt", f"holds {len(prompts)} prompts; at most "
                   f"{settings.API_MAX_PROMPTS} go in one request.")
    for i, p in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if isinstance(p, list):
            _token_ids(p, where)
        elif not isinstance(p, str):
            raise _bad(where, shape, "invalid_type")
        elif not p:
            # Nothing to continue: the engine needs at least one token.
            raise _bad(where, "must not be empty.")
    return prompts


def _logprobs(data: dict) -> int | None:
    """`logprobs`: how many alternatives each token lists (0-20); null: none. OpenAI's
    `true` is chat's, not this endpoint's, and refused as a wrong type."""
    return _int(data, "logprobs", 0, MAX_TOP_LOGPROBS)


def parse_text_completion_request(data: dict) -> TextCompletionRequest:
    """The request, or OpenAIError(400) naming the first field that is wrong."""
    refuse_unsupported(data, HONOURED, IGNORED, UNSUPPORTED)
    model = _model(data)
    prompts = _prompts(data.get("prompt"))
    stream, options = _stream(data)
    n = _int(data, "n", 1, settings.API_MAX_N) or 1
    best_of = _int(data, "best_of", 1, settings.API_MAX_N)
    if best_of is not None and best_of != n:
        # Generating more than is returned, to pick the likeliest, is not done here.
        raise _bad("best_of", f"must equal 'n' ({n}) on this server: it returns every "
                   "sample it generates.", "unsupported_value")
    if len(prompts) * n > settings.API_MAX_PROMPTS:
        raise _bad("n", f"times the {len(prompts)} prompts makes {len(prompts) * n} "
                   f"completions; at most {settings.API_MAX_PROMPTS} go in one request.")
    max_tokens = _int(data, "max_tokens", 1)
    return TextCompletionRequest(
        model=model,
        prompts=prompts,
        stream=stream,
        include_usage=_bool(options, "include_usage", "stream_options."),
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        temperature=_number(data, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(data, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        n=n,
        stop=_stop(data.get("stop")),
        seed=_int(data, "seed", -(2**63), 2**63 - 1),
        user=_optional_str(data, "user", 256),
        cache_salt=_optional_str(data, "cache_salt", 256),
        prefix_cache_receipt=_bool(data, "prefix_cache_receipt"),
        logprobs=_logprobs(data),
        echo=_bool(data, "echo"),
        **_sampling(data),
    )
