"""The Responses API: a request through the chat-completions path (chatapp.api.v1.completions)
and back as a Response object or its stream of events, kept server-side with `store`.

`previous_response_id` replays the stored chain: each earlier turn's messages, and each
reply as the exact ids the engine generated for it (handed to the prompt builder through
prepare's `known` hook), so a turn's prompt is the previous turn's prompt and reply, token
for token, whatever the client kept of the text, and the prefix cache serves all of it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace

from asgiref.sync import sync_to_async

from chatapp.api import response_store
from chatapp.api.errors import OpenAIError
from chatapp.api.models import ApiKey
from chatapp.api.v1 import completions
from chatapp.api.v1.response_params import ResponseRequest, renamed
from chatapp.api.v1.tool_params import calls_key
from chatapp.echo import quoted
from chatapp.prompts.services import default_block_size


def not_found(response_id: str, param: str | None = None) -> OpenAIError:
    """One answer for an id that never existed, was deleted, or is another user's."""
    what = "Previous response" if param else "Response"
    return OpenAIError(404, f"{what} with id {quoted(response_id)} not found.", param=param,
                       code="previous_response_not_found" if param else "response_not_found")


class ChainIds:
    """prepare's `known` hook for a replayed chain: each stored reply's generated ids, by
    the key its turn is looked up by (its text, or its calls' key). Handed out in order, so
    two replies with the same text each get their own ids. Only `model`'s: another
    model's ids are of another tokenizer, so its replies are encoded from their text."""

    def __init__(self, turns: Sequence[response_store.Turn], model: str):
        self._ids: dict[str, list[list[int] | None]] = {}
        for turn in turns:
            ids = turn.output_ids if turn.model == model else None
            self._ids.setdefault(reply_key(turn.output_message), []).append(ids)

    def __call__(self, key: str) -> list[int] | None:
        queue = self._ids.get(key)
        return queue.pop(0) if queue else None


def reply_key(message: dict) -> str:
    """What the prompt builder looks an assistant message up by (chat completions' rule)."""
    calls = message.get("tool_calls")
    if calls:
        return calls_key([call["id"] for call in calls])
    return message.get("content") or ""


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponseRun:
    """One running response: its Completion (started) and the Response object it makes."""

    key: ApiKey
    request: ResponseRequest
    completion: completions.Completion
    model: str  # the served model's alias (check_model)
    id: str = field(default_factory=lambda: _new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    completed_at: int | None = None
    message_id: str = field(default_factory=lambda: _new_id("msg"))
    _calls: list[dict] | None = None  # function_call items, once finished
    _sequence: int = 0

    @property
    def choice(self):
        return self.completion.generation.choices[0]

    # -- the reply ------------------------------------------------------------------

    def _made(self) -> tuple[str, list[dict]]:
        """(the message text, the calls in chat shape) of the finished reply."""
        made = self.completion.tool_calls(self.choice)
        if made is None:
            return self.choice.text, []
        return made[0] or "", made[1]

    def calls(self) -> list[dict]:
        if self._calls is None:
            self._calls = [{"id": _new_id("fc"), "type": "function_call", "status": "completed",
                            "call_id": call["id"], "name": call["function"]["name"],
                            "arguments": call["function"]["arguments"]}
                           for call in self._made()[1]]
        return self._calls

    def message_item(self, text: str, status: str = "completed") -> dict:
        content = [] if status == "in_progress" else [self.text_part(text)]
        return {"id": self.message_id, "type": "message", "role": "assistant",
                "status": status, "content": content}

    @staticmethod
    def text_part(text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def has_message(self, streamed: bool = False) -> bool:
        """A reply that made calls has a message item only when it wrote text too."""
        text, calls = self._made()
        return streamed or bool(text) or not calls

    def output(self, streamed: bool = False) -> list[dict]:
        text, _ = self._made()
        message = [self.message_item(text)] if self.has_message(streamed) else []
        return message + self.calls()

    def status(self) -> str:
        return "incomplete" if self.choice.engine_reason == "length" else "completed"

    def usage(self) -> dict:
        generation = self.completion.generation
        cached = generation.cached_tokens
        block = default_block_size()
        usage = {
            "input_tokens": generation.prompt_tokens,
            # The prompt's whole blocks computed now: what later prompts can hit.
            "input_tokens_details": {
                "cached_tokens": cached,
                "cache_write_tokens": max(0, generation.prompt_tokens // block * block - cached),
            },
            "output_tokens": len(self.choice.token_ids),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": generation.prompt_tokens + len(self.choice.token_ids),
        }
        if self.request.completion.prefix_cache_receipt:
            usage["prefix_cache"] = self.completion.usage()["prefix_cache"]
        return usage

    def body(self, status: str | None = None, streamed: bool = False) -> dict:
        """The Response object; `status` "in_progress" before the reply (no output yet)."""
        req, completion = self.request, self.request.completion
        done = status is None
        status = status or self.status()
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": False, "error": None,
            "incomplete_details": ({"reason": "max_output_tokens"}
                                   if status == "incomplete" else None),
            "instructions": req.instructions, "max_output_tokens": completion.max_tokens,
            "model": req.model, "output": self.output(streamed) if done else [],
            "parallel_tool_calls": completion.tools.parallel if completion.tools else True,
            "previous_response_id": req.previous_response_id, "reasoning": None,
            "store": req.store, "temperature": completion.temperature,
            "text": {"format": req.text_format}, "tool_choice": req.tool_choice,
            "tools": req.tools, "top_p": completion.top_p, "truncation": completion.truncation,
            "usage": self.usage() if done else None, "user": completion.user,
            "metadata": req.metadata, "completed_at": self.completed_at if done else None,
        }

    # -- after the reply ------------------------------------------------------------

    async def finish(self, streamed: bool = False) -> dict:
        """Remember the reply's ids (as chat completions does), store the response when
        asked (before the client hears it is done, so it can be continued at once), and
        return its body."""
        self.completed_at = int(time.time())
        await self.completion.remember()
        body = self.body(streamed=streamed)
        if self.request.store:
            await sync_to_async(self._store)(body)
        return body

    def _store(self, body: dict) -> None:
        text, calls = self._made()
        message = {"role": "assistant", "content": text or None}
        ids = list(self.choice.token_ids)
        if calls:
            message["tool_calls"] = calls
            # The opening tag a forced call's prompt held is part of the turn.
            ids = self.completion.prepared.forced_ids + ids
        response_store.response_store(
            user=self.key.user, response_id=self.id,
            previous_response_id=self.request.previous_response_id,
            input_messages=self.request.input_messages, output_message=message,
            output_ids=ids, body=body, model=self.model,
        )

    async def run(self) -> dict:
        """The whole reply, then its body (OpenAIError on a failed sample)."""
        async with aclosing(self.completion.generation.outputs()) as outputs:
            async for out in outputs:
                self.completion.check(out)
        return await self.finish()

    # -- the stream -----------------------------------------------------------------

    def event(self, kind: str, **data) -> tuple[str, dict]:
        """(event type, its data) with the next sequence number."""
        event = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return kind, event

    def _message_opened(self) -> list[tuple[str, dict]]:
        at = {"item_id": self.message_id, "output_index": 0}
        return [self.event("response.output_item.added", output_index=0,
                           item=self.message_item("", "in_progress")),
                self.event("response.content_part.added", **at, content_index=0,
                           part=self.text_part(""))]

    async def events(self) -> AsyncIterator[tuple[str, dict]]:
        """Every event of the stream, in the order the OpenAI SDK expects them: created,
        the message's text as deltas, each item done, completed (or incomplete)."""
        yield self.event("response.created", response=self.body("in_progress"))
        yield self.event("response.in_progress", response=self.body("in_progress"))
        at = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        opened = False
        async with aclosing(self.completion.generation.outputs()) as outputs:
            async for out in outputs:
                self.completion.check(out)
                delta = self.completion.stream_text(self.choice, out)
                if not delta:
                    continue
                if not opened:
                    for event in self._message_opened():
                        yield event
                    opened = True
                yield self.event("response.output_text.delta", **at, delta=delta, logprobs=[])
        body = await self.finish(streamed=opened)
        if self.has_message(opened):
            if not opened:
                for event in self._message_opened():
                    yield event
            text = self._made()[0]
            yield self.event("response.output_text.done", **at, text=text, logprobs=[])
            yield self.event("response.content_part.done", **at, part=self.text_part(text))
            yield self.event("response.output_item.done", output_index=0,
                             item=self.message_item(text))
        first = 1 if self.has_message(opened) else 0
        for index, call in enumerate(self.calls(), start=first):
            item = {"item_id": call["id"], "output_index": index}
            yield self.event("response.output_item.added", output_index=index,
                             item={**call, "status": "in_progress", "arguments": ""})
            yield self.event("response.function_call_arguments.delta", **item,
                             delta=call["arguments"])
            yield self.event("response.function_call_arguments.done", **item,
                             name=call["name"], arguments=call["arguments"])
            yield self.event("response.output_item.done", output_index=index, item=call)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        yield self.event(kind, response=body)


async def open_response(*, key: ApiKey, request: ResponseRequest) -> ResponseRun:
    """Replay the chain `previous_response_id` names and start the reply; OpenAIError for
    anything the client got wrong (404 for a response that is not the key user's)."""
    turns: list[response_store.Turn] = []
    previous = request.previous_response_id
    if previous:
        try:
            turns = await sync_to_async(response_store.response_chain)(
                user=key.user, response_id=previous)
        except LookupError:
            raise not_found(previous, "previous_response_id") from None
        except response_store.ChainBroken as exc:
            raise OpenAIError(
                404, f"Previous response {quoted(previous)} continues response "
                f"{quoted(exc.missing)}, which was deleted; its history cannot be replayed.",
                param="previous_response_id", code="previous_response_not_found") from None
    history = [m for turn in turns for m in (*turn.input_messages, turn.output_message)]
    req = replace(request.completion, messages=request.messages(history))
    model = completions.check_model(request.model)
    try:
        completion = await completions.open_completion(key=key, req=req,
                                                       known=ChainIds(turns, model))
    except OpenAIError as exc:
        raise renamed(exc) from None
    return ResponseRun(key=key, request=request, completion=completion, model=model)
