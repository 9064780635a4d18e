"""/v1/: the OpenAI-compatible endpoints, as async views (ASGI).

Async so that a stream holds no thread while it waits for tokens, and so that
Django's disconnect handling reaches us: when the client goes, Django cancels the
view (or closes the stream), `Completion.outputs()` closes the generation's stream,
and that aborts the request, on this process's engine or on a worker.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from chatapp.accounting.ratelimit import RateLimited, Slot, active_limiter
from chatapp.api.authentication import InvalidKey, MissingKey, key_for_header
from chatapp.api.errors import OpenAIError, internal, rate_limited
from chatapp.api.models import ApiKey
from chatapp.api.v1 import completions
from chatapp.api.v1.model_entries import entry, listing, require_chat_model
from chatapp.api.v1.parsing import (
    CompletionRequest,
    check_content_type,
    parse_completion_request,
    parse_json,
)
from chatapp.api.v1.usage import accounted, record_usage
from chatapp.echo import quoted

log = logging.getLogger(__name__)


async def authorize(request: HttpRequest) -> ApiKey:
    """The request's key (401 otherwise), with one request counted against its limit."""
    try:
        key = await sync_to_async(key_for_header)(request.headers.get("Authorization"))
    except MissingKey as exc:
        raise OpenAIError(401, str(exc), code="missing_api_key") from None
    except InvalidKey as exc:
        raise OpenAIError(401, str(exc), code="invalid_api_key") from None
    try:
        # In a thread: the Redis limiter reads the key's user and their limits.
        await sync_to_async(active_limiter().hit)(key)
    except RateLimited as exc:
        raise rate_limited(exc) from None
    return key


def method_not_allowed(allowed: str) -> JsonResponse:
    resp = OpenAIError(405, f"Method not allowed; use {allowed}.", code="method_not_allowed")
    out = resp.response()
    out["Allow"] = allowed
    return out


async def serve_generation(request: HttpRequest, *, what: str,
                           parse: Callable[[dict], Any],
                           open_run: Callable[[ApiKey, Any], Awaitable[Any]],
                           stream: Callable[[Any, Slot], AsyncIterator[bytes]],
                           finish: Callable[[Any], Awaitable[dict]]) -> HttpResponse:
    """A generating POST of /v1, the one way each endpoint takes it: the key, the body
    parse(d) into its request (which checks its model), one of the key's concurrency
    slots, then open_run(key, request) and either its stream of server-sent events
    (which releases the slot) or finish(run)'s JSON."""
    if request.method != "POST":
        return method_not_allowed("POST")
    slot: Slot | None = None
    key = req = run = None
    failed = False
    try:
        key = await authorize(request)
        check_content_type(request.content_type)
        req = parse(parse_json(request.body))
        try:
            slot = await sync_to_async(active_limiter().acquire)(key)
        except RateLimited as exc:
            raise rate_limited(exc) from None
        run = await open_run(key, req)
        if req.stream:
            events = accounted(stream(run, slot), run=run, key=key, model=req.model)
            run = None  # the stream records its usage
            response = StreamingHttpResponse(events, content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # proxies must not hold the stream back
            slot = None  # the stream releases it
            return response
        return JsonResponse(await finish(run))
    except OpenAIError as exc:
        failed = True
        return exc.response()
    except RequestDataTooBig:
        too_big = OpenAIError(413, "The request body is too large.", code="request_too_large")
        return too_big.response()
    except Exception:
        failed = True
        log.exception("%s failed", what)
        return internal().response()
    finally:
        if slot is not None:
            slot.release()
        if slot is not None or run is not None:
            # A reply was admitted (it held a slot): it counts, finished or failed.
            await record_usage(run=run, key=key, model=req.model, error=failed)


def _chat_request(body: dict) -> CompletionRequest:
    req = parse_completion_request(body)
    completions.check_model(req.model)
    require_chat_model(req.model)
    return req


async def _whole_completion(completion: completions.Completion) -> dict:
    async for out in completion.generation.outputs():
        completion.check(out)
    await completion.remember()
    return completion.completion_body()


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await serve_generation(
        request, what="chat completion", parse=_chat_request,
        open_run=lambda key, req: completions.open_completion(key=key, req=req),
        stream=sse, finish=_whole_completion)


def _event(data: dict | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


async def sse(completion: completions.Completion, slot: Slot) -> AsyncIterator[bytes]:
    """The completion's chunks (Completion.stream_chunks) as events, `[DONE]` last."""
    try:
        # Closed with the response, so a client that goes aborts the generation now.
        async with aclosing(completion.stream_chunks()) as chunks:
            async for chunk in chunks:
                yield _event(chunk)
    except OpenAIError as exc:
        # Headers are gone already: the error travels as an event (the SDK raises it).
        yield _event(exc.body())
    except Exception:
        log.exception("streaming completion %s failed", completion.id)
        yield _event(internal().body())
    finally:
        slot.release()
    yield _event("[DONE]")


async def models(request: HttpRequest, model: str | None = None) -> HttpResponse:
    """/v1/models, or one model's entry when the URL names it."""
    if request.method != "GET":
        return method_not_allowed("GET")
    try:
        await authorize(request)
        if model is not None:
            completions.check_model(model)
    except OpenAIError as exc:
        return exc.response()
    # The cards read files and engines' settings: off the event loop.
    if model is not None:
        return JsonResponse(await sync_to_async(entry)(model))
    return JsonResponse(await sync_to_async(listing)())


@csrf_exempt
async def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    return OpenAIError(
        404, f"Unknown request URL: {request.method} {quoted(request.path)}.", code="unknown_url"
    ).response()
