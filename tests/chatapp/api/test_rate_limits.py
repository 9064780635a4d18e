"""Acceptance 5 (concurrent generations) and the client-disconnect abort."""

from __future__ import annotations

import time

import httpx2 as httpx
import pytest

from tests.chatapp.api.conftest import MODEL

pytestmark = pytest.mark.model

LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Count from 1 to 200, separated by commas."}],
    "max_tokens": 400,
    "temperature": 0,
    "stream": True,
}


def _metric(server, name: str) -> float:
    """Sum of a metric's samples on /metrics (Prometheus text)."""
    text = httpx.get(server.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"prefixchat:{name}{{") or line.startswith(f"prefixchat:{name} "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_concurrent_generations_and_disconnect(api_server, accounts):
    _, key = accounts.user_with_key(concurrent=1)
    _, other = accounts.user_with_key()
    url = api_server.url + "/v1/chat/completions"
    short = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}

    generated_before = _metric(api_server, "generation_tokens_total")
    with httpx.Client(timeout=300) as client:
        with client.stream("POST", url, json=LONG,
                           headers={"Authorization": f"Bearer {key}"}) as running:
            assert running.status_code == 200
            # Keep the line iterator: dropping it would close the connection right here.
            lines = running.iter_lines()
            first = next(lines)
            assert first.startswith("data: {") and '"error"' not in first
            # While that generation runs, the key has no slot left...
            busy = client.post(url, json=short, headers={"Authorization": f"Bearer {key}"})
            assert busy.status_code == 429
            assert int(busy.headers["Retry-After"]) >= 1
            assert busy.json()["error"]["code"] == "rate_limit_exceeded"
            # ...and other keys are not affected.
            fine = client.post(url, json=short, headers={"Authorization": f"Bearer {other}"})
            assert fine.status_code == 200, fine.text
        # Leaving the stream closes the connection: the server aborts the generation and
        # frees the key's slot (the next request may race the abort, so ask a few times).
        for _ in range(120):
            again = client.post(url, json=short, headers={"Authorization": f"Bearer {key}"})
            if again.status_code != 429:
                break
            time.sleep(0.5)
        assert again.status_code == 200, again.text
    # The engine request was aborted, not left to run: nothing is running any more, and far
    # fewer than the 400 tokens asked for were generated (counting won't end by itself).
    for _ in range(120):
        if _metric(api_server, "num_requests_running") == 0:
            break
        time.sleep(0.5)
    assert _metric(api_server, "num_requests_running") == 0
    generated = _metric(api_server, "generation_tokens_total") - generated_before
    assert 1 <= generated < 400  # (at least one: the metric is really there)
