"""Error bodies: OpenAI's error object on /v1/, DRF's `{"detail": ...}` on /api/.

Neither ever carries a traceback: unexpected failures are logged and answered
with a fixed message.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from chatapp.accounting.ratelimit import RateLimited
from chatapp.api.json_body import RequestTooLarge
from chatapp.chat.errors import ChatError

log = logging.getLogger(__name__)

# Any other status is an "invalid_request_error".
TYPES = {429: "rate_limit_error", 500: "server_error", 503: "server_error"}


@dataclass(eq=False)
class OpenAIError(Exception):
    """An error to answer on /v1/ as `{"error": {message, type, param, code}}`."""

    status: int
    message: str
    _: KW_ONLY
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JsonResponse:
        resp = JsonResponse(self.body(), status=self.status)
        if self.retry_after is not None:
            resp["Retry-After"] = str(self.retry_after)
        if self.status == 401:
            resp["WWW-Authenticate"] = 'Bearer realm="api"'
        return resp


def invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def rate_limited(exc: RateLimited) -> OpenAIError:
    return OpenAIError(429, exc.message, code="rate_limit_exceeded", retry_after=exc.retry_after)


def internal() -> OpenAIError:
    return OpenAIError(500, "The server had an error while processing your request.")


def api_exception_handler(exc, context):
    """DRF's handler, plus our service errors (NotFound, InvalidInput, Busy), rate limits
    and a JSON 500 for anything unexpected."""
    if isinstance(exc, ChatError):
        return Response({"detail": exc.message, "code": exc.code}, status=exc.http_status)
    if isinstance(exc, RateLimited):
        exc = exceptions.Throttled(wait=exc.retry_after, detail=exc.message)
    if isinstance(exc, RequestDataTooBig):
        # Django's limit on request.body (DRF reads the body through it), not a 500.
        exc = RequestTooLarge()
    if isinstance(exc, exceptions.UnsupportedMediaType):
        # DRF's message quotes the Content-Type header whole: say what to send instead.
        exc = exceptions.UnsupportedMediaType(
            "", detail="Unsupported media type: send JSON ('Content-Type: application/json')."
        )
    response = exception_handler(exc, context)
    if response is None:
        log.exception("Unexpected error in %s", context.get("view"))
        return Response(
            {"detail": "Internal server error.", "code": "server_error"},
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    response.data = _detail_body(exc, response.data)
    return response


# DRF's CharField codes, and the one chatapp.chat.services.validate_user_text gives.
UNUSABLE_TEXT = {"null_characters_not_allowed", "surrogate_characters_not_allowed",
                 "invalid_value"}


def _codes(codes) -> set[str]:
    if isinstance(codes, dict):
        codes = list(codes.values())
    if isinstance(codes, list):
        return set().union(*map(_codes, codes))
    return {str(codes)}


def _detail_body(exc, data) -> dict:
    """One error shape for every status: {"detail", "code"} (+ "errors" per field on 400)."""
    if isinstance(exc, exceptions.ValidationError):
        errors = data if isinstance(data, dict) else {"non_field_errors": data}
        # Text a tokenizer cannot take (DRF's CharField refuses NUL and lone surrogates)
        # has the code /v1 and the chat page give it.
        code = "invalid_value" if _codes(exc.get_codes()) & UNUSABLE_TEXT else "invalid"
        return {"detail": "Invalid input.", "code": code, "errors": errors}
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        return {"detail": str(exc.detail), "code": codes if isinstance(codes, str) else "error"}
    return data
