"""Running one reply: prompt from the prompt manager, tokens from the embedded engine,
batched deltas to the conversation's channel-layer group, the result in the database.

A reply streams as `message.delta` events carrying a sequence number each, a few
tokens per event: channels_redis drops messages to a full channel (capacity 100)
without a word, so per-token events would lose text under load, and a client that
sees a gap in the numbers knows to reload the stored message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from chatapp.chat import selectors
from chatapp.chat import services as chat_services
from chatapp.chat.models import Message
from chatapp.chat.serializers import message_dict
from chatapp.generation import prompting
from chatapp.generation.engine import aget_engine

log = logging.getLogger(__name__)

# Replies whose stop arrived before the engine had them (still building the prompt).
_stop_requested: set[int] = set()
# Replies this process is generating now.
_running: set[int] = set()


@dataclass
class PreparedReply:
    reply: Message
    group: str
    prompt: prompting.ReplyPrompt


class ReplyFailed(Exception):
    """A reply that cannot be generated, for a reason the user can act on."""


def group_event(event: dict) -> dict:
    """Wrap an event for group_send; consumers pass `event` to the client as it is."""
    return {"type": "chat.event", "event": event}


async def publish(group: str, event: dict) -> None:
    await get_channel_layer().group_send(group, group_event(event))


def _prepare(reply_id: int, engine) -> PreparedReply:
    reply = Message.objects.select_related("conversation").get(pk=reply_id)
    conversation = reply.conversation
    path = selectors.message_path(message=reply)[:-1]  # up to the user message
    try:
        prompt = prompting.build_reply_prompt(
            tokenizer=engine.tokenizer,
            conversation=conversation,
            history=path,
            max_new_tokens=settings.CHAT_MAX_NEW_TOKENS,
            engine_max_model_len=engine.max_model_len,
        )
    except prompting.PromptFailure as exc:
        raise ReplyFailed(str(exc)) from exc
    chat_services.user_message_store_segment(message=path[-1], token_ids=prompt.user_segment)
    chat_services.reply_mark_streaming(reply=reply)
    return PreparedReply(reply=reply, group=conversation.group_name, prompt=prompt)


def _finish(reply_id: int, **fields) -> dict:
    reply = Message.objects.get(pk=reply_id)
    return message_dict(chat_services.reply_finish(reply=reply, **fields))


def _fail_before_start(reply_id: int, error: str) -> tuple[str, dict]:
    reply = Message.objects.select_related("conversation").get(pk=reply_id)
    done = chat_services.reply_finish(reply=reply, status=Message.Status.ERROR, error=error)
    return reply.conversation.group_name, message_dict(done)


class DeltaBatcher:
    """Collects text deltas; says when a batch is due (enough tokens or enough time)."""

    def __init__(self, batch_tokens: int, flush_s: float):
        self.batch_tokens = max(1, batch_tokens)
        self.flush_s = flush_s
        self.text = ""
        self.tokens = 0
        self.seq = 0
        self.last_flush = time.monotonic()

    def add(self, text: str, n_tokens: int) -> None:
        self.text += text
        self.tokens += n_tokens

    def due(self) -> bool:
        if not self.text:
            return False
        return self.tokens >= self.batch_tokens or (
            time.monotonic() - self.last_flush >= self.flush_s
        )

    def take(self) -> tuple[int, str]:
        self.seq += 1
        text, self.text, self.tokens = self.text, "", 0
        self.last_flush = time.monotonic()
        return self.seq, text


def stop_reply(reply_id: int) -> None:
    """Cancel a reply's engine request (its blocks are freed), wherever it is in its life."""
    _stop_requested.add(reply_id)
    from chatapp.generation import engine as engine_host

    if engine_host._engine is not None:
        engine_host._engine.abort(f"msg-{reply_id}")


def is_running(reply_id: int) -> bool:
    return reply_id in _running


async def run_reply(reply_id: int) -> dict:
    """Generate the pending reply `reply_id` to the end (done, stopped or error).

    Returns the final message dict, also sent to the group as `message.done`.
    Cancelling the task aborts the engine request and keeps the partial reply as stopped.
    """
    _running.add(reply_id)
    heartbeat = asyncio.create_task(_heartbeat(reply_id))
    try:
        return await _run_reply(reply_id)
    finally:
        heartbeat.cancel()
        _running.discard(reply_id)
        _stop_requested.discard(reply_id)


async def _heartbeat(reply_id: int) -> None:
    """Show that a process still works on this reply (see replies_recover_stale)."""
    touch = database_sync_to_async(chat_services.reply_heartbeat)
    while True:
        await asyncio.sleep(settings.CHAT_HEARTBEAT_S)
        await touch(reply_id=reply_id)


async def _run_reply(reply_id: int) -> dict:
    from inference import InvalidRequestError, SamplingParams

    try:
        engine = await aget_engine()
        prepared = await database_sync_to_async(_prepare)(reply_id, engine)
    except ReplyFailed as exc:
        group, final = await database_sync_to_async(_fail_before_start)(reply_id, str(exc))
        await publish(group, {"type": "message.done", "message_id": reply_id, "seq": 1,
                              "message": final})
        return final
    except Exception:
        log.exception("Preparing reply %s failed", reply_id)
        group, final = await database_sync_to_async(_fail_before_start)(
            reply_id, "The model could not be started; see the server log."
        )
        await publish(group, {"type": "message.done", "message_id": reply_id, "seq": 1,
                              "message": final})
        return final

    reply, group, prompt = prepared.reply, prepared.group, prepared.prompt
    await publish(group, {"type": "message.started", "message_id": reply_id,
                          "prompt_tokens": len(prompt.token_ids)})
    params = SamplingParams(
        max_tokens=prompt.max_new_tokens,
        temperature=settings.CHAT_TEMPERATURE,
        top_p=settings.CHAT_TOP_P,
        stop_token_ids=prompt.stop_token_ids,
    )
    batcher = DeltaBatcher(settings.CHAT_STREAM_BATCH_TOKENS, settings.CHAT_STREAM_FLUSH_S)
    last = None
    error = ""
    cancelled = False
    try:
        async for out in engine.generate(
            prompt.token_ids, params, request_id=reply.request_id, cache_salt=prompt.cache_salt
        ):
            last = out
            if reply_id in _stop_requested and not out.finished:
                # The stop came while the prompt was being built, before the engine knew
                # this request id; abort now, the stream then ends with "abort".
                _stop_requested.discard(reply_id)
                engine.abort(reply.request_id)
            batcher.add(out.text_delta, len(out.new_token_ids))
            if batcher.due() and not out.finished:
                seq, text = batcher.take()
                await publish(group, {"type": "message.delta", "message_id": reply_id,
                                      "seq": seq, "text": text})
    except asyncio.CancelledError:
        cancelled = True
        engine.abort(reply.request_id)
    except InvalidRequestError as exc:
        error = str(exc)
    except Exception:
        log.exception("Generating reply %s failed", reply_id)
        error = "Generation failed inside the engine; see the server log."

    if batcher.text:
        seq, text = batcher.take()
        await publish(group, {"type": "message.delta", "message_id": reply_id,
                              "seq": seq, "text": text})

    fields = _final_fields(prompt, last, error=error, cancelled=cancelled)
    final = await database_sync_to_async(_finish)(reply_id, **fields)
    await publish(group, {"type": "message.done", "message_id": reply_id,
                          "seq": batcher.seq + 1, "message": final})
    return final


def _final_fields(prompt: prompting.ReplyPrompt, last, *, error: str, cancelled: bool) -> dict:
    generated = list(last.token_ids) if last is not None else []
    reason = last.finish_reason if last is not None and last.finished else None
    if error or reason == "error":
        status = Message.Status.ERROR
        error = error or (last.error if last is not None else "") or "Generation failed."
    elif reason in ("stop", "length"):
        status = Message.Status.DONE
    else:  # aborted, cancelled, or the stream ended early
        status = Message.Status.STOPPED
        reason = "abort"
    finished_with_eos = reason == "stop"
    fields = {
        "status": status,
        "content": last.text if last is not None else "",
        "generated_token_ids": generated,
        "finish_reason": reason or ("error" if status == Message.Status.ERROR else ""),
        "error": error if status == Message.Status.ERROR else "",
    }
    if status != Message.Status.ERROR:
        fields["segment_token_ids"] = prompting.reply_segment(
            prompt, generated, finished_with_eos=finished_with_eos
        )
    if last is not None:
        fields.update(
            prompt_tokens=last.prompt_tokens,
            cached_tokens=last.cached_tokens,
            ttft=last.ttft,
        )
    return fields
