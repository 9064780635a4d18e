"""POST /v1/completions, a thin async view like chat completions' (chatapp.api.v1.views):
the same key check, rate limit, concurrency slot and error objects, JSON or a stream of
server-sent events."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from chatapp.api.v1 import completions, text_completions
from chatapp.api.v1.text_completion_params import (
    TextCompletionRequest,
    parse_text_completion_request,
)
from chatapp.api.v1.views import serve_generation, sse


def _request(body: dict) -> TextCompletionRequest:
    req = parse_text_completion_request(body)
    completions.check_model(req.model)
    return req


@csrf_exempt
async def create(request: HttpRequest) -> HttpResponse:
    return await serve_generation(
        request, what="text completion", parse=_request,
        open_run=lambda key, req: text_completions.open_text_completion(key=key, req=req),
        stream=sse, finish=lambda completion: completion.run())
