"""Chat completions: an OpenAI-style request through the chat's block-aligned prompt path
to a generation (chatapp.generation.jobs), here or on a worker, and back as OpenAI
bodies, under the key's tenant salt (remembered reply ids: docs/api.md, "Getting
prefix-cache hits").
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings

from chatapp.api import selectors, services
from chatapp.api.errors import OpenAIError, internal, invalid
from chatapp.api.models import ApiKey
from chatapp.api.v1.logprobs import ContentLogprobs, logprobs_object
from chatapp.api.v1.parsing import CompletionRequest
from chatapp.api.v1.tool_params import calls_key
from chatapp.chat.errors import sentence
from chatapp.echo import quoted
from chatapp.generation import dispatch, prompting, receipts, remote, router, served_models
from chatapp.generation.embedded import aget_tokenizer
from chatapp.generation.jobs import Generation, Job, Options, run_here, stop_token_ids
from chatapp.prompts import tools as tools_convention
from chatapp.prompts.encoding import most_chars_per_token
from chatapp.prompts.errors import ContextExceeded, PromptError
from chatapp.prompts.history import ContextLimit, HistoryCut, history_target
from chatapp.prompts.services import builder_for, cache_salt_for, content_text

if TYPE_CHECKING:
    from chatapp.api.v1.text_completion_params import TextCompletionRequest

log = logging.getLogger(__name__)


def model_ids() -> list[str]:
    """What /v1/models lists: every served model, then the default's extra names."""
    return served_models.names_listed()


def check_model(name: str) -> str:
    """The alias of the served model `name` denotes; OpenAI's 404 model_not_found else."""
    try:
        if name:
            return served_models.resolve(name).alias
    except served_models.UnknownModel:
        pass
    available = ", ".join(model_ids())
    raise OpenAIError(404, f"The model {quoted(name)} does not exist. Available: {available}.",
                      param="model", code="model_not_found")


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
    job: Job
    tenant: str
    stop_token_ids: list[int] = field(default_factory=list)
    # Ids the prompt ends with that belong to the reply (a forced call's opening tag).
    forced_ids: list[int] = field(default_factory=list)
    # How the chat format writes tools and calls (chatapp.prompts.tools).
    convention: tools_convention.Hermes = tools_convention.HERMES
    # With truncation "auto": the oldest turns the prompt left out (None: none).
    cut: HistoryCut | None = None

    @property
    def token_ids(self) -> list[int]:
        return list(self.job.prompt_ids)


def prepare(*, key: ApiKey, req: CompletionRequest, tokenizer, model: str = "",
            known: Callable[[str], Sequence[int] | None] | None = None) -> Prepared:
    """Build the prompt and the job for `model` (an alias; its tokenizer is `tokenizer`)
    (sync: it reads the remembered ids and tokenizes). `known(key)`: ids the caller holds
    for an assistant turn (by its text, or its calls' key), before the remembered ones."""
    if req.truncation != "auto":
        check_size(req, tokenizer, model)
    builder = builder_for(tokenizer)
    tenant = tenant_of(key)
    salt = request_salt(key, req.cache_salt)
    convention = tools_convention.convention_for(builder.chat_format)
    # A turn that made tool calls is remembered by its calls' ids: its arguments may come
    # back re-serialised, its text then differing from what the model wrote.
    turns, keys = req.turns(convention)
    remembered: dict[str, list[int]] | None = None

    def lookup(text: str) -> list[int] | None:
        # Fetched once, on the builder's first assistant turn (after its text checks).
        nonlocal remembered
        if known is not None:
            ids = known(keys.get(text, text))
            if ids is not None:
                return list(ids)
        if remembered is None:
            texts = [keys.get(t, t) for role, t in turns if role == "assistant"]
            remembered = selectors.remembered_ids(tenant=tenant, texts=texts)
        return remembered.get(keys.get(text, text))

    limit, starts = None, None
    if req.truncation == "auto":
        limit = truncation_limit(req, model)
        # A turn begins at each of the client's user messages (tool results, which some
        # formats write as user turns, stay with their calls); a system message the tool
        # convention added shifts the indices by one.
        shift = len(turns) - len(req.messages)
        starts = {i + shift for i, m in enumerate(req.messages) if m.get("role") == "user"}
    try:
        plan = builder.build_from_turns(turns, assistant_ids_lookup=lookup, cache_salt=salt,
                                        limit=limit, turn_starts=starts)
    except ContextExceeded as exc:
        raise invalid(_context_message(exc), "messages", "context_length_exceeded") from None
    except PromptError as exc:
        raise invalid(sentence(str(exc), "Invalid messages."), "messages", "invalid_value") from None
    # A forced call starts with its opening (a tag), in the prompt; the grammar takes its
    # JSON, written as the convention writes a call.
    schema, forced = req.json_schema, []
    if req.tools is not None and req.tools.forced:
        # Each function's parameters on their own first, so a refusal names the tool.
        for i, function in req.tools.forced_tools():
            check_schema(json.dumps(function.get("parameters") or {"type": "object"}),
                         f"tools[{i}].function.parameters")
        schema = req.tools.call_schema(convention)
        check_schema(schema, "tools")
        forced = tokenizer.encode(convention.opening, add_special_tokens=False)
    elif schema is not None:
        check_schema(schema)
    job = Job(
        prompt_ids=tuple(plan.token_ids) + tuple(forced),
        cache_salt=salt,
        options=request_options(
            req,
            default_max_tokens=settings.API_DEFAULT_MAX_TOKENS,
            logprobs=req.top_logprobs if req.logprobs else None,
            json_schema=schema,
        ),
        # Each model's engines hold their own blocks: the model is part of the key.
        affinity=router.conversation_key(cache_salt=salt, plan=plan, model=model),
        model=model,
    )
    # The ids the engine stops on (chatapp.generation.jobs), the EOS included.
    return Prepared(job=job, tenant=tenant, stop_token_ids=stop_token_ids(tokenizer),
                    forced_ids=list(forced), convention=convention, cut=plan.cut)


def request_options(req: CompletionRequest | TextCompletionRequest, **own) -> Options:
    """The sampling both completions endpoints take from their request as it is, with
    `own`: what each decides for itself (logprobs, its default max_tokens, ...)."""
    return Options(
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias=tuple(req.logit_bias.items()),
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        n=req.n,
        seed=req.seed,
        stop=tuple(req.stop),
        **own,
    )


def check_size(req: CompletionRequest, tokenizer, model: str) -> None:
    """Refuse, before any text is tokenized, messages with more characters than the
    context's tokens can carry at the most characters a token stands for: tokenizing
    megabytes only to find them too long takes seconds of CPU."""
    chars = sum(len(content_text(m.get("content"))) for m in req.messages)
    context = prompting.context_tokens(model, chat=False)
    if chars > context * most_chars_per_token(tokenizer):
        raise invalid(f"This model's maximum context length is {context} tokens. However, "
                      f"your messages hold {chars} characters, more than {context} tokens "
                      "can carry. Please reduce the length of the messages.", "messages",
                      "context_length_exceeded")


def truncation_limit(req: CompletionRequest, model: str) -> ContextLimit:
    """What `truncation: "auto"` cuts history to: the model's context, room for the
    request's max_tokens (else API_DEFAULT_MAX_TOKENS), CHAT_HISTORY_TARGET."""
    context = prompting.context_tokens(model, chat=False)
    reply = req.max_tokens or settings.API_DEFAULT_MAX_TOKENS
    return ContextLimit(context, min(reply, context - 1), history_target())


def _context_message(exc: ContextExceeded) -> str:
    return (f"This model's maximum context length is {exc.max_model_len} tokens. However, "
            f"the last turn alone resulted in {exc.prompt_tokens} tokens with every earlier "
            "turn left out, which leaves no room for a reply. Please shorten it.")


def check_schema(schema: str, param: str = "response_format") -> None:
    """Refuse a schema we cannot enforce here, before a job is queued: a 400 naming the
    problem and `param` (the field the schema came from), never free text instead (the
    engine that runs the job compiles it again, against its own tokenizer, and would
    refuse it the same way)."""
    from inference import InvalidRequestError
    from inference.grammar import grammar_for_schema

    try:
        grammar_for_schema(schema, param)
    except InvalidRequestError as exc:
        raise invalid(str(exc), exc.param, exc.code) from None


def grammar_failed(problem: str, req: CompletionRequest) -> OpenAIError:
    """The 400 of a reply whose schema the grammar could not follow to the end (it
    compiled, then ran out of the parser's limits): it names the schema's owner, the
    tools of a forced call or response_format."""
    param = "tools" if req.tools is not None and req.tools.forced else "response_format"
    return invalid(f"The JSON schema of {quoted(param)} could not be followed: {problem}",
                   param, "invalid_json_schema")


@dataclass
class Completion:
    """One running request as OpenAI bodies: its Generation (started, so a refused
    request was answered with a status code before any byte of a stream) and the ids
    and timestamps of the response."""

    req: CompletionRequest
    prepared: Prepared
    generation: Generation
    tokenizer: object = None  # names the tokens of `logprobs`
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    _calls: dict = field(default_factory=dict)  # choice index -> tool_calls() result
    _sent: dict = field(default_factory=dict)  # choice index -> characters streamed
    _streamed: dict = field(default_factory=dict)  # choice index -> content streamed
    _aligned: dict = field(default_factory=dict)  # choice index -> ContentLogprobs

    def check(self, out) -> None:
        """A sample that failed inside the engine fails the response: a 400 when the
        schema it was held to could not be followed (the caller's schema), else a 500
        with no internals shown."""
        if out.finished and out.finish_reason == "error":
            from inference.grammar import failure_of

            problem = failure_of(out.error)
            if problem is not None:
                raise grammar_failed(problem, self.req)
            log.error("Completion %s failed: %s", self.id, out.error)
            raise internal()

    def truncation(self) -> dict:
        """With truncation "auto": what the prompt left out of the request's messages."""
        cut = self.prepared.cut
        return {"type": "auto", "messages_left_out": cut.messages if cut else 0,
                "turns_left_out": cut.turns if cut else 0,
                "tokens_left_out": cut.tokens if cut else 0}

    def usage(self) -> dict:
        usage = {**self.generation.usage(), "completion_tokens_details": {"reasoning_tokens": 0}}
        if self.req.prefix_cache_receipt:  # only when asked: SDKs are not surprised
            # A stateless request has no previous turn to diverge from.
            usage["prefix_cache"] = receipts.receipt(self.generation.prefix_cache, None, 1)
        return usage

    async def remember(self) -> None:
        """Keep the ids of every reply that can come back as history (see RememberedReply).

        A reply cut by a stop *string* is not kept: its ids carry text the client never
        saw, so splicing them would put words into the history the client did not send.
        """
        eos_like = set(self.prepared.stop_token_ids)
        keep = []
        for c in self.generation.choices.values():
            reason = c.engine_reason
            ended_by_eos = reason == "stop" and c.token_ids and c.token_ids[-1] in eos_like
            if reason == "length" or ended_by_eos:
                made = self.tool_calls(c)
                if made is not None:
                    # Known by its calls' ids, with the opening tag a forced call's prompt
                    # held: exactly the ids this turn's prompt and generation computed.
                    key = calls_key([call["id"] for call in made[1]])
                    keep.append((key, self.prepared.forced_ids + list(c.token_ids)))
                else:
                    keep.append((c.text, c.token_ids))
        if keep:
            await sync_to_async(services.replies_remember)(tenant=self.prepared.tenant, replies=keep)

    # -- bodies ------------------------------------------------------------------

    def _body(self, kind: str, choices: list[dict], **extra) -> dict:
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.req.model,
                "choices": choices, **extra}
        if self.req.truncation == "auto":
            body["truncation"] = self.truncation()
        return body

    def tool_calls(self, choice) -> tuple[str | None, list[dict]] | None:
        """(the content before them, the calls in OpenAI's shape) when a finished choice
        made tool calls; None otherwise. Ids are given once a choice."""
        tools = self.req.tools
        if tools is None or not tools.active or choice.engine_reason is None:
            return None
        if choice.index not in self._calls:
            convention = self.prepared.convention
            text = choice.text
            if tools.forced:  # the opening was the prompt's; the grammar ended the JSON
                text = convention.forced_text(text)
            content, parsed = convention.parse_calls(text, tools.names)
            if not tools.parallel:
                parsed = parsed[:1]
            self._calls[choice.index] = (content or None, [
                {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": call.name,
                              "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
                for call in parsed
            ]) if parsed else None
        return self._calls[choice.index]

    def stream_text(self, choice, out) -> str:
        """The content a stream sends for output `out`: its delta, except that with tools
        offered the text from a call's opening tag on is held until the end."""
        tools = self.req.tools
        if tools is None or not tools.active:
            return out.text_delta
        if tools.forced:
            return ""
        sent = self._sent.get(choice.index, 0)
        upto = len(choice.text) if out.finished and not self.tool_calls(choice) else (
            self.prepared.convention.held_back(choice.text))
        self._sent[choice.index] = max(sent, upto)
        return choice.text[sent:upto]

    def stream_calls(self, choice) -> list[dict] | None:
        """The tool_calls delta a finished choice ends with (each call whole)."""
        made = self.tool_calls(choice)
        if made is None:
            return None
        return [{"index": i, **call} for i, call in enumerate(made[1])]

    def finish_reason(self, choice) -> str:
        return "tool_calls" if self.tool_calls(choice) else (choice.finish_reason or "stop")

    def message(self, choice) -> dict:
        made = self.tool_calls(choice)
        if made is None:
            return {"role": "assistant", "content": choice.text, "refusal": None}
        return {"role": "assistant", "content": made[0], "refusal": None, "tool_calls": made[1]}

    def completion_body(self) -> dict:
        choices = [
            {
                "index": c.index,
                "message": self.message(c),
                "logprobs": self.logprobs(c, self.message(c)["content"] or "", final=True),
                "finish_reason": self.finish_reason(c),
            }
            for c in sorted(self.generation.choices.values(), key=lambda c: c.index)
        ]
        return self._body("chat.completion", choices, usage=self.usage())

    def logprobs(self, choice, content: str, final: bool) -> dict | None:
        """The `logprobs` of a choice's tokens that `content` (its content so far, or all
        of it when `final`) covers and earlier calls did not hand out: a body's whole
        list, or a chunk's part of it; None when not asked for."""
        if not self.req.logprobs:
            return None
        if choice.index not in self._aligned:
            self._aligned[choice.index] = ContentLogprobs(self.tokenizer)
        return logprobs_object(self._aligned[choice.index].take(choice.logprobs, content, final))

    # -- the stream: every chat.completion.chunk is shaped here ---------------------

    def chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        extra = {"usage": usage} if self.req.include_usage else {}
        return self._body("chat.completion.chunk", choices, **extra)

    @staticmethod
    def _chunk_choice(index: int, delta: dict, finish_reason: str | None = None,
                      logprobs: dict | None = None) -> dict:
        return {"index": index, "delta": delta, "logprobs": logprobs,
                "finish_reason": finish_reason}

    def chunks_for(self, out) -> list[dict]:
        """The chunks one output of the generation makes. A sample's first chunk goes out
        with its first token (carrying the role), never before: clients time TTFT on it."""
        self.check(out)
        choice = self.generation.choices[out.index]
        chunks = []
        text = self.stream_text(choice, out)
        streamed = self._streamed[out.index] = self._streamed.get(out.index, "") + text
        if text or not choice.started:
            delta = {"content": text}
            if not choice.started:
                delta = {"role": "assistant", **delta}
                choice.started = True
            chunks.append(self.chunk([self._chunk_choice(
                out.index, delta, logprobs=self.logprobs(choice, streamed, final=False))]))
        if out.finished:
            calls = self.stream_calls(choice)
            if calls:
                chunks.append(self.chunk([self._chunk_choice(out.index, {"tool_calls": calls})]))
            # The rest of the content's tokens (one a stop string began inside) end here.
            chunks.append(self.chunk([self._chunk_choice(
                out.index, {}, self.finish_reason(choice),
                logprobs=self.logprobs(choice, streamed, final=True))]))
        return chunks

    async def stream_chunks(self) -> AsyncIterator[dict]:
        """Every chat.completion.chunk of the response, the usage chunk last (when asked
        for); the replies are remembered before it. OpenAIError on a failed sample."""
        async with aclosing(self.generation.outputs()) as outputs:
            async for out in outputs:
                for chunk in self.chunks_for(out):
                    yield chunk
        await self.remember()
        if self.req.include_usage:
            yield self.chunk([], usage=self.usage())


async def open_completion(*, key: ApiKey, req: CompletionRequest,
                          known: Callable[[str], Sequence[int] | None] | None = None,
                          ) -> Completion:
    """Prepare and start a completion, here or on a worker by the dispatch rule;
    OpenAIError for anything the client got wrong. `known`: as prepare() takes it."""
    from inference import InvalidRequestError

    model = check_model(req.model)
    tokenizer = await aget_tokenizer(model)
    prepared = await sync_to_async(prepare)(key=key, req=req, tokenizer=tokenizer, model=model,
                                            known=known)
    job = prepared.job
    queue = await sync_to_async(dispatch.completion_queue)(
        max_tokens=job.options.max_tokens or job.options.default_max_tokens,
        affinity=job.affinity, model=model,
    )
    source = run_here if queue is None else (lambda j: remote.relay(j, queue))
    generation = Generation(job, source)
    try:
        await generation.start()
    except InvalidRequestError as exc:
        if exc.code == "invalid_json_schema" and req.tools is not None and req.tools.forced:
            # The engine compiled the forced call's schema, built from the tools.
            problem = str(exc).partition(": ")[2] or str(exc)
            raise invalid(f"The JSON schema of 'tools' is not supported: {problem}", "tools",
                          exc.code) from None
        raise invalid(str(exc), exc.param, exc.code) from None
    except dispatch.GenerationUnavailable as exc:
        raise OpenAIError(503, exc.message, code="service_unavailable") from None
    except StopAsyncIteration:
        raise internal() from None
    return Completion(req=req, prepared=prepared, generation=generation, tokenizer=tokenizer)
