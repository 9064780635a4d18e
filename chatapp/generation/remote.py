"""A /v1 generation run by a Celery worker, streamed back to the web process.

The web process opens a channel of its own on the channel layer (Redis) and queues
the job with that channel's name; the worker sends every engine output to it, in
order, then "end". Messages go to one channel, not a group, so none is dropped
silently: a full channel makes the worker wait (and give up when nobody reads). A
client that leaves sets an abort flag in the worker registry's Redis, which the
worker's generation polls every CHAT_STOP_POLL_S.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings

from chatapp.generation import dispatch, registry
from chatapp.generation.embedded import aget_engine
from chatapp.generation.jobs import Job, run_here
from chatapp.generation.served_models import UnknownModel

log = logging.getLogger(__name__)

# How long a worker waits on a full channel before taking its reader for gone.
SEND_PATIENCE_S = 30.0


def _abort_key(request_id: str) -> str:
    return f"prefixchat:abort:{request_id}"


# The running text and ids grow with every token: a stream carries only the deltas,
# and the whole of both once, with the output that finishes a sample (a stop string
# may cut the text there).
_CUMULATIVE = ("text", "token_ids")


def _message(out) -> dict:
    data = dataclasses.asdict(out)
    if not out.finished:
        for key in _CUMULATIVE:
            del data[key]
    return {"type": "gen.output", "kind": "output", "output": data}


class _Outputs:
    """RequestOutputs again from the messages _message made, running text and ids
    rebuilt from the deltas."""

    def __init__(self):
        from inference.outputs import PrefixCacheRecord, RequestOutput
        from inference.sampler import TokenLogprob

        self._make, self._record, self._logprob = RequestOutput, PrefixCacheRecord, TokenLogprob
        self._names = {f.name for f in dataclasses.fields(RequestOutput)}
        self._text: dict[int, str] = {}
        self._ids: dict[int, list[int]] = {}

    def __call__(self, data: dict):
        i = data["index"]
        if "text" not in data:
            data["text"] = self._text.get(i, "") + data["text_delta"]
            data["token_ids"] = self._ids.get(i, []) + list(data["new_token_ids"])
        self._text[i], self._ids[i] = data["text"], data["token_ids"]
        out = self._make(**{k: v for k, v in data.items() if k in self._names})
        if isinstance(out.prefix_cache, dict):
            out.prefix_cache = self._record(**out.prefix_cache)
        if out.new_logprobs:
            out.new_logprobs = [self._entry(e) for e in out.new_logprobs]
        if out.prompt_logprobs:
            out.prompt_logprobs = [self._entry(e) for e in out.prompt_logprobs]
        return out

    def _entry(self, e: dict | None):
        """A TokenLogprob again (None stays None: a prompt's first token has none)."""
        if e is None:
            return None
        return self._logprob(e["token_id"], e["logprob"], tuple(map(tuple, e["top"])))


# -- the web process's side ----------------------------------------------------------


async def relay(job: Job, queue: str) -> AsyncIterator:
    """The job's outputs as a worker behind `queue` produces them. Leaving early (the
    client went) aborts the job on the worker."""
    from inference import InvalidRequestError

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await sync_to_async(dispatch.enqueue_completion)(job=dataclasses.asdict(job), channel=channel,
                                                     queue=queue)
    # Bounded like a reply a worker makes: the task's own time limit, plus its queueing.
    timeout = settings.CELERY_TASK_TIME_LIMIT + 60
    ended = False
    output = _Outputs()
    try:
        while True:
            message = await asyncio.wait_for(layer.receive(channel), timeout)
            kind = message.get("kind")
            if kind == "output":
                yield output(message["output"])
            elif kind == "refused":
                ended = True
                raise InvalidRequestError(message["message"], message.get("param"),
                                          code=message.get("code"))
            elif kind == "end":
                ended = True
                return
    finally:
        if not ended:
            await sync_to_async(_flag_abort)(job.request_id)


def _flag_abort(request_id: str) -> None:
    try:
        registry.client().set(_abort_key(request_id), 1, ex=max(60, settings.CELERY_TASK_TIME_LIMIT))
    except Exception:
        log.warning("Flagging %s to stop failed", request_id, exc_info=True)


# -- the worker's side ---------------------------------------------------------------


async def serve(job: Job, channel: str) -> dict:
    """Run `job` on this worker's engine, sending each output to `channel`; returns a
    summary. Stops when the abort flag is set or nobody reads the channel any more."""
    from inference import InvalidRequestError

    layer = get_channel_layer()
    try:
        engine = await aget_engine(job.model)
    except UnknownModel as exc:  # the router sends a worker only its own models' jobs
        await _send(layer, channel, {"type": "gen.output", "kind": "refused", "message": str(exc),
                                     "param": "model", "code": "model_not_found"})
        return {"outcome": "refused", "outputs": 0}
    watcher = asyncio.create_task(_watch_abort(engine, job.request_id))
    outputs = 0
    reasons: dict[int, str] = {}
    try:
        async for out in run_here(job):
            await _send(layer, channel, _message(out))
            outputs += 1
            if out.finished:
                reasons[out.index] = out.finish_reason
    except InvalidRequestError as exc:
        await _send(layer, channel, {"type": "gen.output", "kind": "refused",
                                     "message": str(exc), "param": exc.param, "code": exc.code})
        return {"outcome": "refused", "outputs": 0}
    except ChannelFull:
        log.warning("Nobody reads %s any more; generation %s aborted", channel, job.request_id)
        return {"outcome": "abandoned", "outputs": outputs}
    finally:
        watcher.cancel()
    await _send(layer, channel, {"type": "gen.output", "kind": "end"})
    return {"outcome": "generated", "outputs": outputs,
            "finish_reasons": [reasons[i] for i in sorted(reasons)]}


async def _send(layer, channel: str, message: dict) -> None:
    waited = 0.0
    while True:
        try:
            await layer.send(channel, message)
            return
        except ChannelFull:
            if waited >= SEND_PATIENCE_S:
                raise
            await asyncio.sleep(0.05)
            waited += 0.05


async def _watch_abort(engine, request_id: str) -> None:
    flagged = sync_to_async(lambda: bool(registry.client().exists(_abort_key(request_id))))
    while True:
        await asyncio.sleep(settings.CHAT_STOP_POLL_S)
        try:
            if await flagged():
                engine.abort(request_id)
                return
        except Exception:
            log.warning("Reading the abort flag of %s failed", request_id, exc_info=True)
