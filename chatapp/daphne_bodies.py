"""Under daphne, request bodies reach the app unparsed, whatever their Content-Type,
and within REQUEST_BODY_TIMEOUT_S of the request's first line or not at all.

Twisted (daphne's HTTP layer) parses every POST body declared multipart/form-data or
application/x-www-form-urlencoded into `request.args`, before daphne hands the request
to the app, which never reads that parse. A malformed multipart body (JSON sent as
multipart/form-data, say) is answered right there with a bare 400: no body, no log line,
and no way for /v1 to answer with its error object. A well-formed one costs a parse of
the whole upload for nothing. Twisted's `parsePOSTFormSubmission=False` turns that off;
the app then answers a body it does not take with its own error (415, logged).

Daphne also buffers the whole body before it calls the app, so the app's own body timeout
(chatapp.body_timeout) never sees a slow one: a client announcing `Content-Length: 1000`
and trickling bytes would hold its connection for ever. Each request therefore gets a
timer from its first line; if the body is not complete when it fires, the answer is a
408 written straight to the connection, which is then closed.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging

log = logging.getLogger(__name__)


def leave_bodies_to_the_app() -> None:
    """Make daphne's requests skip twisted's form parsing (idempotent; a no-op without
    daphne or with a twisted too old to have the switch)."""
    try:
        from daphne.http_protocol import WebRequest
        from twisted.web.http import Request
    except ImportError:
        return
    if getattr(WebRequest, "_bodies_left_to_the_app", False):
        return
    if "parsePOSTFormSubmission" not in inspect.signature(Request.__init__).parameters:
        return
    init = WebRequest.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parsePOSTFormSubmission", False)
        init(self, *args, **kwargs)

    WebRequest.__init__ = __init__
    WebRequest._bodies_left_to_the_app = True


def _timeout_response() -> bytes:
    body = json.dumps({"error": {
        "message": "The request body did not arrive in time.", "type": "invalid_request_error",
        "param": None, "code": "request_timeout"}}).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head + body


def time_out_slow_bodies(timeout_s: float) -> None:
    """Answer 408 and close a connection whose request is not wholly received within
    `timeout_s` of its first line (idempotent; 0 or less: off; a no-op without daphne)."""
    try:
        from daphne.http_protocol import WebRequest
        from twisted.internet import reactor
    except ImportError:
        return
    if timeout_s <= 0 or getattr(WebRequest, "_bodies_timed", False):
        return
    init, received, lost = (WebRequest.__init__, WebRequest.requestReceived,
                            WebRequest.connectionLost)

    def expire(request) -> None:
        request._body_timer = None
        transport = getattr(request.channel, "transport", None)
        if transport is None:
            return
        log.warning("A request body was incomplete after %.0f s: answered 408", timeout_s)
        transport.write(_timeout_response())
        transport.loseConnection()

    def cancel(request) -> None:
        timer = getattr(request, "_body_timer", None)
        if timer is not None and timer.active():
            timer.cancel()
        request._body_timer = None

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._body_timer = reactor.callLater(timeout_s, expire, self)

    @functools.wraps(received)
    def requestReceived(self, *args, **kwargs):
        cancel(self)
        return received(self, *args, **kwargs)

    @functools.wraps(lost)
    def connectionLost(self, *args, **kwargs):
        cancel(self)
        return lost(self, *args, **kwargs)

    WebRequest.__init__ = __init__
    WebRequest.requestReceived = requestReceived
    WebRequest.connectionLost = connectionLost
    WebRequest._bodies_timed = True
