"""Web request metrics for /metrics: counts and latency by view and status, labelled by
the resolved URL name, never the raw path (ids in URLs would grow the series unbounded)."""

from __future__ import annotations

import logging
import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from chatapp.dashboard import web_metrics

log = logging.getLogger(__name__)


def _view_label(request) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "unmatched"
    return match.view_name or "unnamed"


def _observe(request, status: int, started: float) -> None:
    try:
        web_metrics.observe(
            method=request.method or "", view=_view_label(request), status=status,
            seconds=time.perf_counter() - started,
        )
    except Exception:  # metrics are a diagnostic: a request never fails for them
        log.debug("request metrics failed", exc_info=True)


class RequestMetricsMiddleware:
    """Works in both sync and async stacks (the chat runs under daphne)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        started = time.perf_counter()
        response = self.get_response(request)
        _observe(request, response.status_code, started)
        return response

    async def __acall__(self, request):
        started = time.perf_counter()
        response = await self.get_response(request)
        _observe(request, response.status_code, started)
        return response
