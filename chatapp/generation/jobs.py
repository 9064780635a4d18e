"""One way to run a generation, for every caller: chat replies, the conversations API
(through chatapp.generation.replies) and /v1.

A `Job` is plain data, so a Celery worker can run it as well as this process. Sampling
parameters, stop ids and the context limit come from here alone, against the engine
that runs the job (its own `max_model_len`). `Generation` streams the engine's outputs
and keeps what a caller reports at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from chatapp.generation.embedded import aget_engine
from chatapp.prompts.errors import FormatError
from chatapp.prompts.services import builder_for


@dataclass(frozen=True)
class Options:
    # None: as many as `default_max_tokens`, cut to the room the context leaves.
    max_tokens: int | None = None
    default_max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # (token id, bias) pairs: a tuple keeps the job hashable and JSON-safe (int keys).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Go on past the end tokens (the chat format's end of turn too), for benchmarks; and
    # ban them until the reply holds min_tokens.
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Log-probabilities of the generated tokens, with this many alternatives (None: off).
    logprobs: int | None = None
    # Log-probabilities of the prompt's own tokens, with this many alternatives (None:
    # off): the prompt is then computed whole (inference.prompt_logprobs).
    prompt_logprobs: int | None = None
    # Structured output: the JSON Schema (JSON text) the reply must match (None: free
    # text). Carried as text, so the job stays plain data; the process that runs it
    # compiles it against its own engine's tokenizer (inference.grammar, cached there).
    json_schema: str | None = None


@dataclass(frozen=True)
class Job:
    prompt_ids: tuple[int, ...]
    cache_salt: str
    options: Options = Options()
    request_id: str = field(default_factory=lambda: f"gen-{uuid.uuid4().hex}")
    # Which conversation this is, for worker affinity (chatapp.generation.router).
    affinity: str = ""
    # The model that runs it (an alias of LLM_MODELS; "": the default).
    model: str = ""

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        """The job dataclasses.asdict() made, after a trip through JSON (tuples as lists)."""
        options = dict(data.get("options") or {})
        options["stop"] = tuple(options.get("stop") or ())
        options["logit_bias"] = tuple(tuple(p) for p in options.get("logit_bias") or ())
        return cls(**{**data, "prompt_ids": tuple(data["prompt_ids"]),
                      "options": Options(**options)})


def stop_token_ids(tokenizer) -> list[int]:
    """The chat format's end-of-turn token and the tokenizer's EOS; the EOS alone for a
    tokenizer no chat format fits (a base model's, serving text completions)."""
    try:
        ids = set(builder_for(tokenizer).stop_token_ids)
    except FormatError:
        ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def sampling_params(job: Job, *, max_model_len: int, tokenizer):
    """The engine's parameters for `job`; InvalidRequestError when the prompt, with an
    explicit max_tokens, does not fit the context (the rule is the engine's:
    inference.sampling_params.check_context_length). Without one, max_tokens is
    default_max_tokens cut to the room the prompt leaves."""
    from inference import SamplingParams
    from inference.sampling_params import check_context_length

    opts = job.options
    prompt = len(job.prompt_ids)
    if opts.max_tokens is None:
        max_tokens = max(1, min(opts.default_max_tokens, max_model_len - prompt))
    else:
        max_tokens = opts.max_tokens
        check_context_length(prompt, max_model_len, max_tokens)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k,
        min_p=opts.min_p,
        presence_penalty=opts.presence_penalty,
        frequency_penalty=opts.frequency_penalty,
        repetition_penalty=opts.repetition_penalty,
        logit_bias=dict(opts.logit_bias),
        n=opts.n,
        seed=opts.seed,
        stop=list(opts.stop),
        stop_token_ids=[] if opts.ignore_eos else stop_token_ids(tokenizer),
        ignore_eos=opts.ignore_eos,
        min_tokens=opts.min_tokens,
        logprobs=opts.logprobs,
        prompt_logprobs=opts.prompt_logprobs,
        json_schema=opts.json_schema,
    )


async def run_here(job: Job) -> AsyncIterator:
    """The job on this process's engine of its model; leaving the loop early aborts it."""
    engine = await aget_engine(job.model)
    params = sampling_params(job, max_model_len=engine.max_model_len, tokenizer=engine.tokenizer)
    stream = engine.generate(
        list(job.prompt_ids), params, request_id=job.request_id, cache_salt=job.cache_salt
    )
    try:
        async for out in stream:
            yield out
    finally:
        await stream.aclose()


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    engine_reason: str | None = None  # "stop" | "length" | "abort" | "error", once finished
    error: str | None = None
    started: bool = False  # a stream has sent this sample's first chunk
    # Its tokens' log-probabilities, when asked for (inference.sampler.TokenLogprob).
    logprobs: list = field(default_factory=list)

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's reason ("abort" only comes from a stop we asked for: client gone)."""
        if self.engine_reason is None:
            return None
        return "length" if self.engine_reason == "length" else "stop"


class Generation:
    """One running job: start() waits for the first output (so a refused request raises
    InvalidRequestError before anything was sent), outputs() streams the rest; closing
    the stream, or leaving it early, aborts the job wherever it runs."""

    def __init__(self, job: Job, source: Callable[[Job], AsyncIterator]):
        self.job = job
        self.choices = {i: Choice(i) for i in range(job.options.n)}
        self.prompt_tokens = len(job.prompt_ids)
        self.cached_tokens = 0
        self.ttft: float | None = None
        self.prefix_cache = None  # the engine's receipt (inference.outputs.PrefixCacheRecord)
        # With Options.prompt_logprobs: None for the first prompt token, then a
        # TokenLogprob per prompt token (sent with sample 0's first output).
        self.prompt_logprobs: list | None = None
        self._stream = source(job)
        self._first = None

    async def start(self) -> None:
        self._first = await self._stream.__anext__()

    async def close(self) -> None:
        """Abort the job wherever it runs, without reading on (a request refused once
        some of its generations had started)."""
        await self._stream.aclose()

    async def outputs(self) -> AsyncIterator:
        """The outputs, the first (received by start) included; each is recorded."""
        try:
            if self._first is not None:
                first, self._first = self._first, None
                self._record(first)
                yield first
            async for out in self._stream:
                self._record(out)
                yield out
        finally:
            await self._stream.aclose()

    def _record(self, out) -> None:
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        if out.index == 0:
            self.prompt_tokens, self.cached_tokens = out.prompt_tokens, out.cached_tokens
            self.ttft = out.ttft if out.ttft is not None else self.ttft
            self.prefix_cache = out.prefix_cache or self.prefix_cache
        choice = self.choices.setdefault(out.index, Choice(out.index))
        choice.text, choice.token_ids = out.text, out.token_ids  # a fresh list per output
        if out.new_logprobs:
            choice.logprobs.extend(out.new_logprobs)
        if out.finished:
            choice.engine_reason, choice.error = out.finish_reason, out.error

    def usage(self) -> dict:
        completion = sum(len(c.token_ids) for c in self.choices.values())
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

