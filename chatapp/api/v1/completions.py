"""Chat completions: an OpenAI-style request through the stable prompt path to the engine.

The prompt comes from PromptBuilder.build_from_messages, the same block-aligned
path as the chat UI; assistant messages whose text this tenant's earlier replies
produced are spliced back as the exact ids generated (see RememberedReply). The
engine request runs under the key's tenant salt, so tenants never share blocks.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from django.conf import settings

from chatapp.api import selectors, services
from chatapp.api.errors import OpenAIError, internal, invalid
from chatapp.api.models import ApiKey
from chatapp.api.v1.parsing import CompletionRequest
from chatapp.prompts.errors import ContextLengthExceeded, PromptError
from chatapp.prompts.services import PromptBuilder, cache_salt_for

log = logging.getLogger(__name__)


def model_ids() -> list[str]:
    return [settings.LLM_MODEL, *[a for a in settings.API_MODEL_ALIASES if a != settings.LLM_MODEL]]


def check_model(name: str) -> None:
    if name not in model_ids():
        raise OpenAIError(
            404,
            f"The model '{name}' does not exist. Available: {', '.join(model_ids())}.",
            param="model",
            code="model_not_found",
        )


@functools.cache
def _builder(tokenizer) -> PromptBuilder:
    # One per tokenizer: it caches the encoded system segments clients repeat.
    return PromptBuilder(tokenizer, block_size=settings.LLM_BLOCK_SIZE)


def tenant_of(key: ApiKey) -> str:
    """The key's tenant: its owner's cache salt (an organisation's, where the user has one)."""
    return cache_salt_for(key.user)


def request_salt(key: ApiKey, requested: str | None) -> str:
    tenant = tenant_of(key)
    if requested is None:
        return tenant
    if not key.allow_cache_salt:
        raise invalid(
            "'cache_salt' is not enabled for this API key.", "cache_salt", "cache_salt_not_allowed"
        )
    # Derived inside the tenant: a client's salt partitions its own tenant's cache,
    # it can never name (and so share) another tenant's blocks.
    return cache_salt_for(f"{tenant}/{requested}")


@dataclass
class Prepared:
    token_ids: list[int]
    max_tokens: int
    salt: str
    tenant: str
    stop_token_ids: list[int]


def prepare(*, key: ApiKey, req: CompletionRequest, tokenizer, max_model_len: int) -> Prepared:
    """Build the prompt (sync: it reads the remembered ids and tokenizes)."""
    builder = _builder(tokenizer)
    tenant = tenant_of(key)
    salt = request_salt(key, req.cache_salt)
    texts = [_text(m) for m in req.messages if m.get("role") == "assistant"]
    remembered = selectors.remembered_ids(tenant=tenant, texts=texts)
    try:
        plan = builder.build_from_messages(
            req.messages,
            max_model_len=max_model_len,
            max_new_tokens=req.max_tokens or 1,
            assistant_ids_lookup=remembered.get,
            cache_salt=salt,
        )
    except ContextLengthExceeded as exc:
        raise invalid(
            f"This model's maximum context length is {exc.max_model_len} tokens. However, you "
            f"requested {exc.prompt_tokens + exc.max_new_tokens} tokens ({exc.prompt_tokens} in "
            f"the messages, {exc.max_new_tokens} in the completion). Please reduce the length "
            "of the messages or completion.",
            "messages",
            "context_length_exceeded",
        ) from None
    except PromptError as exc:
        raise invalid(_sentence(str(exc)), "messages", "invalid_value") from None
    room = max_model_len - len(plan.token_ids)
    max_tokens = req.max_tokens or min(settings.API_DEFAULT_MAX_TOKENS, room)
    stop_ids = set(builder.stop_token_ids)
    if tokenizer.eos_token_id is not None:
        stop_ids.add(int(tokenizer.eos_token_id))
    return Prepared(
        token_ids=list(plan.token_ids),
        max_tokens=max_tokens,
        salt=salt,
        tenant=tenant,
        stop_token_ids=sorted(stop_ids),
    )


def _text(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else "Invalid messages."


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # as OpenAI names it
    engine_reason: str | None = None  # as the engine said it
    started: bool = False


@dataclass
class Completion:
    """One running request: call start() (raises OpenAIError for a bad request), then
    consume events() to the end, or let it be closed (which aborts the engine request)."""

    key: ApiKey
    req: CompletionRequest
    engine: object
    prepared: Prepared
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    choices: dict[int, Choice] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    _stream: AsyncIterator | None = None
    _first: object = None

    @property
    def request_id(self) -> str:
        return f"api-{self.id}"

    def params(self):
        from inference import SamplingParams

        return SamplingParams(
            max_tokens=self.prepared.max_tokens,
            temperature=self.req.temperature,
            top_p=self.req.top_p,
            n=self.req.n,
            seed=self.req.seed,
            stop=list(self.req.stop),
            stop_token_ids=self.prepared.stop_token_ids,
        )

    async def start(self) -> None:
        """Send the request and wait for its first output, so a request the engine refuses
        is answered with a status code, before any byte of a stream."""
        from inference import InvalidRequestError

        self.choices = {i: Choice(i) for i in range(self.req.n)}
        self._stream = self.engine.generate(
            self.prepared.token_ids,
            self.params(),
            request_id=self.request_id,
            cache_salt=self.prepared.salt,
        )
        try:
            self._first = await self._stream.__anext__()
        except InvalidRequestError as exc:
            raise invalid(str(exc), exc.param, exc.code) from None
        except StopAsyncIteration:
            raise internal() from None

    async def outputs(self):
        """The engine's outputs, the first (already received) included; records each."""
        pending = [self._first] if self._first is not None else []
        self._first = None
        try:
            for out in pending:
                self._record(out)
                yield out
            async for out in self._stream:
                self._record(out)
                yield out
        finally:
            await self._stream.aclose()  # aborts the engine request if it is still running

    def _record(self, out) -> None:
        if out.index == 0 or not self.prompt_tokens:
            self.prompt_tokens = out.prompt_tokens
            self.cached_tokens = out.cached_tokens
        choice = self.choices.setdefault(out.index, Choice(out.index))
        choice.text = out.text
        choice.token_ids = list(out.token_ids)
        if out.finished:
            if out.finish_reason == "error":
                log.error("Completion %s failed: %s", self.id, out.error)
                raise internal()
            # "abort" only comes from our own stop (client gone): report it as a stop.
            choice.finish_reason = "length" if out.finish_reason == "length" else "stop"
            choice.engine_reason = out.finish_reason

    def usage(self) -> dict:
        completion = sum(len(c.token_ids) for c in self.choices.values())
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }

    async def remember(self) -> None:
        """Keep the ids of every reply that can come back as history (see RememberedReply).

        A reply cut by a stop *string* is not kept: its ids carry text the client never
        saw, so splicing them would put words into the history the client did not send.
        """
        stop_ids = set(self.prepared.stop_token_ids)
        keep = []
        for c in self.choices.values():
            reason = c.engine_reason
            ended_by_eos = reason == "stop" and c.token_ids and c.token_ids[-1] in stop_ids
            if reason == "length" or ended_by_eos:
                keep.append((c.text, c.token_ids))
        if keep:
            await sync_to_async(services.replies_remember)(tenant=self.prepared.tenant, replies=keep)

    # -- bodies ------------------------------------------------------------------

    def completion_body(self) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.req.model,
            "choices": [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": c.finish_reason or "stop",
                }
                for c in sorted(self.choices.values(), key=lambda c: c.index)
            ],
            "usage": self.usage(),
        }

    def chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.req.model,
            "choices": choices,
        }
        if self.req.include_usage:
            body["usage"] = usage
        return body


async def open_completion(*, key: ApiKey, req: CompletionRequest) -> Completion:
    """Prepare and start a completion; OpenAIError for anything the client got wrong."""
    from chatapp.generation.engine import aget_engine

    check_model(req.model)
    engine = await aget_engine()
    prepared = await sync_to_async(prepare)(
        key=key, req=req, tokenizer=engine.tokenizer, max_model_len=engine.max_model_len
    )
    completion = Completion(key=key, req=req, engine=engine, prepared=prepared)
    await completion.start()
    return completion
