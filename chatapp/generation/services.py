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
from django.db import transaction

from chatapp.chat import selectors
from chatapp.chat import services as chat_services
from chatapp.chat.models import Message
from chatapp.chat.serializers import message_dict
from chatapp.generation import prompting
from chatapp.generation.engine import aget_engine, loaded_engine

log = logging.getLogger(__name__)

# Replies whose stop arrived before the engine had them (still building the prompt).
_stop_requested: set[int] = set()
# Replies this process is generating now.
_running: set[int] = set()
# Replies whose claim another generation took over: this process aborts and goes quiet.
_superseded: set[int] = set()


@dataclass
class PreparedReply:
    reply: Message
    group: str
    prompt: prompting.ReplyPrompt


class _StoppedEarly(Exception):
    pass


class ReplyFailed(Exception):
    """A reply that cannot be generated, for a reason the user can act on."""


def group_event(event: dict) -> dict:
    """Wrap an event for group_send; consumers pass `event` to the client as it is."""
    return {"type": "chat.event", "event": event}


async def publish(group: str, event: dict) -> None:
    await get_channel_layer().group_send(group, group_event(event))


async def _publish_reply(group: str, event: dict) -> None:
    """publish() for a reply's own events, unless its claim went to another generation
    (the page must not see two streams for one reply)."""
    if event.get("message_id") not in _superseded:
        await publish(group, event)


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
    chat_services.reply_mark_streaming(reply=reply, served_by=engine.config.engine_id)
    return PreparedReply(reply=reply, group=conversation.group_name, prompt=prompt)


def _finish(reply_id: int, lease: str = "", **fields) -> dict | None:
    """Record the end of a reply; None when `lease` was taken over by another generation
    (that one writes the reply, this one's result is dropped)."""
    with transaction.atomic():
        reply = Message.objects.select_for_update().get(pk=reply_id)
        if lease and reply.lease != lease:
            log.warning("Reply %s was taken over by another generation; dropping ours", reply_id)
            return None
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


def stop_reply(reply_id: int) -> bool:
    """Cancel a reply's engine request in this process (its blocks are freed), wherever it
    is in its life; False when this process does not generate it."""
    if reply_id not in _running:
        return False  # finished already, or generated by another process
    _stop_requested.add(reply_id)
    engine = loaded_engine()
    if engine is not None:
        engine.abort(f"msg-{reply_id}")
    return True


def request_stop(reply_id: int) -> None:
    """Stop a reply wherever it runs: here at once, elsewhere (a worker) through the flag
    its generation polls every CHAT_STOP_POLL_S."""
    if not stop_reply(reply_id):
        chat_services.reply_request_stop(reply_id=reply_id)


async def arequest_stop(reply_id: int) -> None:
    if not stop_reply(reply_id):
        await database_sync_to_async(chat_services.reply_request_stop)(reply_id=reply_id)


def is_running(reply_id: int) -> bool:
    return reply_id in _running


async def run_reply(reply_id: int, *, lease: str = "") -> dict:
    """Generate the pending reply `reply_id` to the end (done, stopped or error).

    Returns the final message dict, also sent to the group as `message.done`.
    Cancelling the task aborts the engine request and keeps the partial reply as stopped.
    `lease` is a worker's claim (chat.services.reply_claim): the reply is written only
    while the claim holds, and a stop asked for by another process is polled for.
    """
    _running.add(reply_id)
    watchers = [asyncio.create_task(_heartbeat(reply_id, lease))]
    if lease:
        watchers.append(asyncio.create_task(_watch_stop_flag(reply_id)))
    try:
        return await _run_reply(reply_id, lease)
    except Message.DoesNotExist:
        # The conversation was deleted meanwhile; there is nothing left to record.
        stop_reply(reply_id)
        return {}
    finally:
        for watcher in watchers:
            watcher.cancel()
        _running.discard(reply_id)
        _stop_requested.discard(reply_id)
        _superseded.discard(reply_id)


async def _heartbeat(reply_id: int, lease: str = "") -> None:
    """Show that a process still works on this reply (see replies_recover_stale)."""
    touch = database_sync_to_async(chat_services.reply_heartbeat)
    while True:
        await asyncio.sleep(settings.CHAT_HEARTBEAT_S)
        if not await touch(reply_id=reply_id, lease=lease) and lease:
            # Another worker took the reply over (ours looked dead): stop generating it.
            log.warning("Reply %s was taken over by another generation; aborting ours", reply_id)
            _superseded.add(reply_id)
            stop_reply(reply_id)
            return


async def _watch_stop_flag(reply_id: int) -> None:
    """Turn a stop flagged in the database (by the web process) into an engine abort."""
    flagged = database_sync_to_async(chat_services.reply_stop_requested)
    while True:
        await asyncio.sleep(settings.CHAT_STOP_POLL_S)
        try:
            if await flagged(reply_id=reply_id):
                stop_reply(reply_id)
                return
        except Exception:
            log.warning("Reading the stop flag of reply %s failed", reply_id, exc_info=True)


async def _run_reply(reply_id: int, lease: str = "") -> dict:
    from inference import InvalidRequestError, SamplingParams

    try:
        engine = await aget_engine()
        prepared = await database_sync_to_async(_prepare)(reply_id, engine)
    except ReplyFailed as exc:
        group, final = await database_sync_to_async(_fail_before_start)(reply_id, str(exc))
        await publish(group, {"type": "message.done", "message_id": reply_id, "seq": 1,
                              "message": final})
        return final
    except Message.DoesNotExist:
        raise
    except Exception:
        log.exception("Preparing reply %s failed", reply_id)
        group, final = await database_sync_to_async(_fail_before_start)(
            reply_id, "The model could not be started; see the server log."
        )
        await publish(group, {"type": "message.done", "message_id": reply_id, "seq": 1,
                              "message": final})
        return final

    reply, group, prompt = prepared.reply, prepared.group, prepared.prompt
    await _publish_reply(group, {"type": "message.started", "message_id": reply_id,
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
    try:
        if reply_id in _stop_requested:
            raise _StoppedEarly  # stopped while the prompt was being built
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
                await _publish_reply(group, {"type": "message.delta", "message_id": reply_id,
                                      "seq": seq, "text": text})
    except _StoppedEarly:
        pass  # recorded as stopped below, with no tokens
    except asyncio.CancelledError:
        engine.abort(reply.request_id)  # recorded as stopped below, with its partial text
    except InvalidRequestError as exc:
        error = str(exc)
    except Exception:
        log.exception("Generating reply %s failed", reply_id)
        error = "Generation failed inside the engine; see the server log."

    if batcher.text:
        seq, text = batcher.take()
        await _publish_reply(group, {"type": "message.delta", "message_id": reply_id,
                              "seq": seq, "text": text})

    fields = _final_fields(prompt, last, error=error)
    final = await database_sync_to_async(_finish)(reply_id, lease, **fields)
    if final is None:
        return {}
    await _publish_reply(group, {"type": "message.done", "message_id": reply_id,
                          "seq": batcher.seq + 1, "message": final})
    return final


def _final_fields(prompt: prompting.ReplyPrompt, last, *, error: str) -> dict:
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
