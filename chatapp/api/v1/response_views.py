"""/v1/responses: create (JSON or a stream of server-sent events), retrieve and delete,
as async views like the rest of /v1 (chatapp.api.v1.views)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from chatapp.accounting.ratelimit import Slot
from chatapp.api import response_store
from chatapp.api.errors import OpenAIError, internal, invalid
from chatapp.api.v1 import completions, responses
from chatapp.api.v1.model_entries import require_chat_model
from chatapp.api.v1.response_params import ResponseRequest, parse_response_request
from chatapp.api.v1.views import authorize, method_not_allowed, serve_generation
from chatapp.echo import quoted

log = logging.getLogger(__name__)


def _request(body: dict) -> ResponseRequest:
    req = parse_response_request(body)
    completions.check_model(req.model)
    require_chat_model(req.model)  # a reply needs the model's chat template
    return req


@csrf_exempt
async def create(request: HttpRequest) -> HttpResponse:
    return await serve_generation(
        request, what="response", parse=_request,
        open_run=lambda key, req: responses.open_response(key=key, request=req),
        stream=_sse, finish=lambda run: run.run())


def _event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _sse(run: responses.ResponseRun, slot: Slot) -> AsyncIterator[bytes]:
    """The run's events; a failure after the headers went is an `error` event."""
    try:
        # Closed with the response, so a client that goes aborts the generation now.
        async with aclosing(run.events()) as events:
            async for kind, data in events:
                yield _event(kind, data)
    except Exception as exc:
        if not isinstance(exc, OpenAIError):
            log.exception("streaming response %s failed", run.id)
            exc = internal()
        yield _event(*run.event("error", code=exc.code, message=exc.message, param=exc.param))
    finally:
        slot.release()


@csrf_exempt
async def detail(request: HttpRequest, response_id: str) -> HttpResponse:
    """GET a stored response, or DELETE it: only the key user's; any other id is a 404."""
    if request.method not in ("GET", "DELETE"):
        return method_not_allowed("GET, DELETE")
    try:
        key = await authorize(request)
        for name in request.GET:  # streaming a stored response again is not kept
            raise invalid(f"Query parameter {quoted(name)} is not supported by this server.",
                          name[:64], "unsupported_parameter")
        if request.method == "DELETE":
            if not await sync_to_async(response_store.response_delete)(
                    user=key.user, response_id=response_id):
                raise responses.not_found(response_id)
            return JsonResponse({"id": response_id, "object": "response", "deleted": True})
        body = await sync_to_async(response_store.response_body)(
            user=key.user, response_id=response_id)
        if body is None:
            raise responses.not_found(response_id)
        return JsonResponse(body)
    except OpenAIError as exc:
        return exc.response()
    except Exception:
        log.exception("response %s: %s failed", quoted(response_id), request.method)
        return internal().response()
