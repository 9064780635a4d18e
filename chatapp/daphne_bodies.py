"""Under daphne, request bodies reach the app unparsed, whatever their Content-Type.

Twisted (daphne's HTTP layer) parses every POST body declared multipart/form-data or
application/x-www-form-urlencoded into `request.args`, before daphne hands the request
to the app, which never reads that parse. A malformed multipart body (JSON sent as
multipart/form-data, say) is answered right there with a bare 400: no body, no log line,
and no way for /v1 to answer with its error object. A well-formed one costs a parse of
the whole upload for nothing. Twisted's `parsePOSTFormSubmission=False` turns that off;
the app then answers a body it does not take with its own error (415, logged).
"""

from __future__ import annotations

import functools
import inspect


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
