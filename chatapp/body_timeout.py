"""A bound on how long an HTTP request's body may take to arrive (ASGI middleware).

Django's ASGI handler reads the whole body before it runs a view, with no time limit: a
client that announces `Content-Length: 1000` and sends 10 bytes holds the request (and
its slot in the server) open for as long as it likes. Here the body must be complete
within REQUEST_BODY_TIMEOUT_S of the request's start; otherwise the answer is 408, a
JSON error in the shape of the API the path belongs to, with `Connection: close` (the
rest of the body may still be on its way), and a log line.

Only the body is timed: once it is in, `receive` waits untimed again (Django listens on
it for the client's disconnect while a reply streams). A server that buffers the whole
body before it calls the app (daphne does) never lets a slow body reach this middleware;
its own idle timeout governs there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from chatapp.echo import quoted

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTimeout(Exception):
    """Raised out of `receive` when the body is late; caught by the middleware."""


def _error_body(path: str, message: str) -> bytes:
    if path.startswith("/v1/"):
        body: dict = {"error": {"message": message, "type": "invalid_request_error",
                                "param": None, "code": "request_timeout"}}
    else:
        body = {"detail": message, "code": "request_timeout"}
    return json.dumps(body).encode()


class BodyTimeoutMiddleware:
    def __init__(self, app: ASGIApp, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.timeout_s <= 0:
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_done = False
        response_started = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise BodyTimeout from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, tracked_send)
        except BodyTimeout:
            path = scope.get("path", "")
            log.warning("Request body for %s %s not complete within %gs: answered 408",
                        scope.get("method"), quoted(path), self.timeout_s)
            if response_started:  # cannot happen with Django (it reads the body first)
                return
            body = _error_body(path, f"The request body did not arrive within "
                                     f"{self.timeout_s:g} seconds.")
            await send({"type": "http.response.start", "status": 408, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]})
            await send({"type": "http.response.body", "body": body})
