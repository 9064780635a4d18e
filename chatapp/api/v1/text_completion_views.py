"""POST /v1/completions, a thin async view like chat completions' (chatapp.api.v1.views):
the same key check, rate limit, concurrency slot and error objects, JSON or a stream of
server-sent events."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from chatapp.api.errors import OpenAIError, internal, rate_limited
from chatapp.api.ratelimit import RateLimited, Slot, limiter
from chatapp.api.v1 import completions, text_completions
from chatapp.api.v1.parsing import check_content_type, parse_json
from chatapp.api.v1.text_completion_params import parse_text_completion_request
from chatapp.api.v1.views import _authorize, _method_not_allowed, _sse

log = logging.getLogger(__name__)


@csrf_exempt
async def create(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST")
    slot: Slot | None = None
    try:
        key = await _authorize(request)
        check_content_type(request.content_type)
        req = parse_text_completion_request(parse_json(request.body))
        completions.check_model(req.model)
        try:
            slot = limiter.acquire(key)
        except RateLimited as exc:
            raise rate_limited(exc) from None
        completion = await text_completions.open_text_completion(key=key, req=req)
        if req.stream:
            response = StreamingHttpResponse(_sse(completion, slot),
                                             content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # proxies must not hold the stream back
            slot = None  # the stream releases it
            return response
        return JsonResponse(await completion.run())
    except OpenAIError as exc:
        return exc.response()
    except RequestDataTooBig:
        return OpenAIError(413, "The request body is too large.",
                           code="request_too_large").response()
    except Exception:
        log.exception("text completion failed")
        return internal().response()
    finally:
        if slot is not None:
            slot.release()
