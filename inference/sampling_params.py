"""Per-request sampling settings, validated before the request enters the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class InvalidRequestError(ValueError):
    """A request the caller got wrong: it is refused, the engine goes on."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


def check_context_length(prompt_tokens: int, max_model_len: int,
                         max_tokens: int | None = None) -> None:
    """The context rule and its wording (OpenAI's), owned here: the prompt leaves room for
    at least one generated token, and for `max_tokens` of them when a caller asked for
    that many. LLMEngine.validate applies the first part to every request; a caller that
    knows an explicit max_tokens (chatapp.generation.jobs) applies both."""
    if prompt_tokens >= max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"messages resulted in {prompt_tokens} tokens, which leaves no room for a reply. "
            "Please reduce the length of the messages.",
            "messages",
            code="context_length_exceeded",
        )
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            "messages",
            code="context_length_exceeded",
        )


MAX_LOGPROBS = 20
# OpenAI's bounds: penalties in [-2, 2], a bias in [-100, 100] (-100 bans a token, 100
# all but forces it). A repetition penalty above 2 only garbles text: (0, 2].
# MAX_LOGIT_BIAS bounds the entries of one request, and so its work.
MAX_PENALTY = 2.0
MAX_BIAS = 100.0
MAX_LOGIT_BIAS = 1024


def _real(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value))


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off; else keep tokens with p >= min_p * the top token's p
    # Penalties on tokens already generated (presence: once; frequency: per occurrence),
    # OpenAI's; repetition_penalty (1 = off) divides the logits of tokens in the prompt or
    # the output, as transformers and vLLM do (inference.sampler.adjust_logits).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # token id -> bias added to its logit, in [-100, 100].
    logit_bias: dict[int, float] = field(default_factory=dict)
    n: int = 1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    # Stop at the model's end-of-sequence tokens (off only for benchmarks).
    ignore_eos: bool = False
    # The end tokens (stop_token_ids, and the EOS unless ignore_eos) are banned until the
    # output holds this many tokens (vLLM's); stop strings still apply.
    min_tokens: int = 0
    # Log-probabilities of each generated token and of this many most likely tokens at its
    # position (0-20, as OpenAI's top_logprobs); None: not computed.
    logprobs: int | None = None
    # The prompt's own log-probabilities, of each prompt token but the first, with this
    # many alternatives (0-20; vLLM's prompt_logprobs), computed during prefill
    # (inference.prompt_logprobs); None: not computed. The prompt is then computed whole,
    # not read from the prefix cache (the cache holds KV, not the logits); its blocks
    # are still cached for later requests.
    prompt_logprobs: int | None = None
    # Structured output: the reply must be JSON valid under this JSON Schema (JSON text).
    # LLMEngine.compile_grammar turns it into `grammar` (inference.grammar.Grammar) before
    # the request enters the engine; a schema it cannot honour is refused, never loosened.
    json_schema: str | None = None
    grammar: object | None = field(default=None, repr=False, compare=False)

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be an integer >= 1", "max_tokens")
        if self.temperature < 0:
            raise InvalidRequestError("temperature must be >= 0", "temperature")
        if not (0 < self.top_p <= 1):
            raise InvalidRequestError("top_p must be in (0, 1]", "top_p")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError("top_k must be an integer >= 0", "top_k")
        if not _real(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidRequestError("min_p must be in [0, 1]", "min_p")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _real(value) or abs(value) > MAX_PENALTY:
                raise InvalidRequestError(f"{name} must be in [-2, 2]", name)
        if not _real(self.repetition_penalty) or not 0 < self.repetition_penalty <= 2:
            raise InvalidRequestError("repetition_penalty must be in (0, 2]",
                                      "repetition_penalty")
        self._check_logit_bias()
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or not (
                0 <= self.min_tokens <= self.max_tokens):
            raise InvalidRequestError("min_tokens must be an integer in [0, max_tokens]",
                                      "min_tokens")
        if self.min_tokens and self.json_schema is not None:
            # A complete value ends with the end token, which min_tokens would ban.
            raise InvalidRequestError("min_tokens cannot be combined with structured output",
                                      "min_tokens")
        if not isinstance(self.n, int) or self.n < 1:
            raise InvalidRequestError("n must be an integer >= 1", "n")
        if self.logprobs is not None and (
            isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
            or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise InvalidRequestError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}]",
                                      "top_logprobs")
        if self.prompt_logprobs is not None and (
            isinstance(self.prompt_logprobs, bool) or not isinstance(self.prompt_logprobs, int)
            or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            raise InvalidRequestError(
                f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}]", "logprobs")
        if self.json_schema is not None and not isinstance(self.json_schema, str):
            raise InvalidRequestError("json_schema must be JSON text", "response_format")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must be non-empty strings", "stop")

    def _check_logit_bias(self) -> None:
        bias = self.logit_bias
        if not isinstance(bias, dict):
            raise InvalidRequestError("logit_bias must map token ids to numbers", "logit_bias")
        if len(bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens",
                                      "logit_bias")
        for token, value in bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise InvalidRequestError(
                    f"logit_bias keys must be token ids (integers >= 0), got {token!r}",
                    "logit_bias")
            if not _real(value) or abs(value) > MAX_BIAS:
                raise InvalidRequestError(
                    f"logit_bias values must be in [-100, 100], got {value!r} for token {token}",
                    "logit_bias")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
