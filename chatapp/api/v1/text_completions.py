"""Text completions (POST /v1/completions): each prompt, as text or token ids, continued
as it is, with no chat format, through the path chat completions take (a Job on the
generation path of chatapp.generation.jobs, here or on a worker), under the key's tenant
salt (so prompts share cached blocks within a tenant only), and back as OpenAI's legacy
`text_completion` bodies or their stream.

A batch of prompts runs as one generation per prompt, all at once; choice `i * n + j` is
sample j of prompt i, as OpenAI numbers them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from chatapp.api.errors import OpenAIError, internal, invalid
from chatapp.api.models import ApiKey
from chatapp.api.v1 import completions
from chatapp.api.v1.legacy_logprobs import LegacyLogprobs, joined
from chatapp.api.v1.text_completion_params import TextCompletionRequest
from chatapp.generation import dispatch, prompting, receipts, remote, router
from chatapp.generation.embedded import aget_tokenizer
from chatapp.generation.jobs import Generation, Job, run_here

log = logging.getLogger(__name__)


@dataclass
class Prompt:
    ids: list[int]
    text: str  # what `echo` puts before the completion: the prompt as sent, or decoded


def encode_prompts(req: TextCompletionRequest, tokenizer, context: int) -> list[Prompt]:
    """Each prompt's ids (text is encoded with the tokenizer's special tokens, a base
    model's BOS among them; ids are taken as sent); a 400 context_length_exceeded for a
    prompt that leaves no room for max_tokens."""
    prompts = []
    for i, p in enumerate(req.prompts):
        where = "prompt" if len(req.prompts) == 1 else f"prompt[{i}]"
        if isinstance(p, str):
            # A string longer in characters than the context could hold in tokens is
            # refused before it is tokenized: a megabyte costs the tokenizer seconds.
            if len(p.encode()) > context * _most_bytes_per_token(tokenizer):
                raise _too_long(where, context, f"{len(p)} characters")
            ids = list(tokenizer.encode(p))
            text = p
        else:
            ids, text = list(p), tokenizer.decode(p)
        if len(ids) + req.max_tokens > context:
            raise _too_long(where, context, f"{len(ids)} tokens", req.max_tokens)
        prompts.append(Prompt(ids, text))
    return prompts


@functools.cache
def _most_bytes_per_token(tokenizer) -> int:
    """The most bytes of text one token can stand for: no more characters than its
    vocabulary entry's spelling holds (a byte-level entry spells a byte with one
    character, a SentencePiece byte as "<0x41>"), at most 4 bytes each."""
    return 4 * max((len(entry) for entry in tokenizer.get_vocab()), default=1)


def _too_long(where: str, context: int, size: str, max_tokens: int | None = None) -> OpenAIError:
    reply = f", with {max_tokens} for the completion" if max_tokens is not None else ""
    return invalid(f"This model's maximum context length is {context} tokens. However, your "
                   f"prompt holds {size}{reply}. Please shorten the prompt or lower "
                   "max_tokens.", where, "context_length_exceeded")


def job_for(req: TextCompletionRequest, prompt: Prompt, *, salt: str, model: str) -> Job:
    scored = req.logprobs if req.echo and req.logprobs is not None else None
    return Job(
        prompt_ids=tuple(prompt.ids),
        cache_salt=salt,
        options=completions.request_options(req, logprobs=req.logprobs, prompt_logprobs=scored),
        affinity=router.prompt_key(cache_salt=salt, token_ids=prompt.ids, model=model),
        model=model,
    )


async def _merged(generations: list[Generation]) -> AsyncIterator[tuple[int, object]]:
    """(generation index, output) from every generation as each comes; leaving early
    closes them all (which aborts what still runs)."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, generation: Generation) -> None:
        try:
            async with aclosing(generation.outputs()) as outputs:
                async for out in outputs:
                    await queue.put((i, out))
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put((i, exc))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class TextCompletion:
    """One running request: a started Generation per prompt, and its bodies."""

    req: TextCompletionRequest
    prompts: list[Prompt]
    generations: list[Generation]
    tokenizer: object
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    _logprobs: dict = field(default_factory=dict)  # choice index -> LegacyLogprobs
    _echoed: set = field(default_factory=set)  # choice indices whose prompt went out
    _streamed: dict = field(default_factory=dict)  # choice index -> completion text sent

    def check(self, out) -> None:
        """A sample that failed inside the engine fails the response (no internals shown)."""
        if out.finished and out.finish_reason == "error":
            log.error("Completion %s failed: %s", self.id, out.error)
            raise internal()

    def usage(self) -> dict:
        """Every prompt counted once, whatever n; cached_tokens across the prompts."""
        parts = [g.usage() for g in self.generations]
        prompt = sum(u["prompt_tokens"] for u in parts)
        completion = sum(u["completion_tokens"] for u in parts)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": sum(
                     u["prompt_tokens_details"]["cached_tokens"] for u in parts)}}
        if self.req.prefix_cache_receipt:  # the first prompt's, as chat's one prompt
            usage["prefix_cache"] = receipts.receipt(self.generations[0].prefix_cache, None, 1)
        return usage

    def _body(self, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.req.model, "choices": choices, "system_fingerprint": None,
                **extra}

    def _index(self, prompt: int, sample: int) -> int:
        return prompt * self.req.n + sample

    def _echo(self, index: int, prompt: int) -> tuple[str, dict | None]:
        """The echoed prompt and its logprobs part, once a choice (when asked for)."""
        if not self.req.echo or index in self._echoed:
            return "", None
        self._echoed.add(index)
        p = self.prompts[prompt]
        if self.req.logprobs is None:
            return p.text, None
        scored = self.generations[prompt].prompt_logprobs
        return p.text, self._legacy(index).prompt(p.ids, scored, p.text)

    def _legacy(self, index: int) -> LegacyLogprobs:
        if index not in self._logprobs:
            self._logprobs[index] = LegacyLogprobs(self.tokenizer)
        return self._logprobs[index]

    def _part(self, index: int, prompt: int, choice, content: str, final: bool) -> tuple[str, dict | None]:
        """(text, logprobs) of what a choice adds: its prompt first (echo), then the
        completion's text up to `content`."""
        echo, echo_logprobs = self._echo(index, prompt)
        sent = self._streamed.get(index, "")
        self._streamed[index] = content
        if self.req.logprobs is None:
            return echo + content[len(sent):], None
        part = self._legacy(index).take(choice.logprobs, content, final)
        return echo + content[len(sent):], joined(*filter(None, (echo_logprobs, part)))

    def completion_body(self) -> dict:
        choices = []
        for p, generation in enumerate(self.generations):
            for c in sorted(generation.choices.values(), key=lambda c: c.index):
                index = self._index(p, c.index)
                text, logprobs = self._part(index, p, c, c.text, final=True)
                choices.append({"text": text, "index": index, "logprobs": logprobs,
                                "finish_reason": c.finish_reason or "stop"})
        choices.sort(key=lambda c: c["index"])
        return self._body(choices, usage=self.usage())

    async def run(self) -> dict:
        async with aclosing(_merged(self.generations)) as outputs:
            async for _, out in outputs:
                self.check(out)
        return self.completion_body()

    def chunks_for(self, prompt: int, out) -> list[dict]:
        """The chunk one output makes (its text, and the prompt before it with echo); a
        finished sample's chunk carries its finish_reason."""
        self.check(out)
        choice = self.generations[prompt].choices[out.index]
        index = self._index(prompt, out.index)
        streamed = self._streamed.get(index, "") + out.text_delta
        text, logprobs = self._part(index, prompt, choice, streamed, final=out.finished)
        if not text and not out.finished and index in self._echoed:
            return []
        reason = (choice.finish_reason or "stop") if out.finished else None
        extra = {"usage": None} if self.req.include_usage else {}
        return [self._body([{"text": text, "index": index, "logprobs": logprobs,
                             "finish_reason": reason}], **extra)]

    async def stream_chunks(self) -> AsyncIterator[dict]:
        """Every chunk of the response, the usage chunk last (when asked for)."""
        async with aclosing(_merged(self.generations)) as outputs:
            async for prompt, out in outputs:
                for chunk in self.chunks_for(prompt, out):
                    yield chunk
        if self.req.include_usage:
            yield self._body([], usage=self.usage())


async def open_text_completion(*, key: ApiKey, req: TextCompletionRequest) -> TextCompletion:
    """Encode the prompts and start a generation for each, here or on a worker by the
    dispatch rule; OpenAIError for anything the client got wrong (before any is sent)."""
    from inference import InvalidRequestError

    model = completions.check_model(req.model)
    tokenizer = await aget_tokenizer(model)
    salt = await sync_to_async(completions.request_salt)(key, req.cache_salt)
    context = prompting.context_tokens(model, chat=False)
    prompts = await asyncio.to_thread(encode_prompts, req, tokenizer, context)
    generations = []
    for prompt in prompts:
        job = job_for(req, prompt, salt=salt, model=model)
        queue = await sync_to_async(dispatch.completion_queue)(
            max_tokens=req.max_tokens, affinity=job.affinity, model=model)
        source = run_here if queue is None else (lambda j, q=queue: remote.relay(j, q))
        generations.append(Generation(job, source))
    try:
        # Started together, so the engine batches the prompts' prefills.
        results = await asyncio.gather(*(g.start() for g in generations),
                                       return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed
    except BaseException as exc:
        # What started already is aborted: nothing of a refused request runs on.
        await asyncio.gather(*(g.close() for g in generations), return_exceptions=True)
        if isinstance(exc, InvalidRequestError):
            param = "prompt" if exc.param in ("messages", "prompt") else exc.param
            raise invalid(str(exc), param, exc.code) from None
        if isinstance(exc, dispatch.GenerationUnavailable):
            raise OpenAIError(503, exc.message, code="service_unavailable") from None
        if isinstance(exc, StopAsyncIteration):
            raise internal() from None
        raise
    return TextCompletion(req=req, prompts=prompts, generations=generations,
                          tokenizer=tokenizer)
