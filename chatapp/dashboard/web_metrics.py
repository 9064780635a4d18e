"""The web service's own request metrics, in a registry of their own (not the global one,
so tests and reloads never hit "duplicated timeseries")."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

registry = CollectorRegistry(auto_describe=True)

REQUESTS = Counter(
    "prefixchat:http_requests",
    "HTTP requests answered by the web service.",
    ["method", "view", "status"],
    registry=registry,
)
LATENCY = Histogram(
    "prefixchat:http_request_duration_seconds",
    "Time to produce an HTTP response (streaming bodies excluded).",
    ["method", "view"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=registry,
)


def observe(*, method: str, view: str, status: int, seconds: float) -> None:
    REQUESTS.labels(method=method, view=view, status=str(status)).inc()
    LATENCY.labels(method=method, view=view).observe(seconds)
