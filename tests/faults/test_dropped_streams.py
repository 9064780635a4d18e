"""100 dropped streams, then 0 leaked KV blocks (the fault suite, on a live server).

Each client opens a /v1 stream, reads its first chunk and hangs up mid-reply. The server
must abort every generation (not run it to max_tokens) and free every block: once the
engine is idle, /metrics shows 0 blocks in use (cached blocks that nobody holds are
"cached_free", not "used"). The earlier probe did 20 streams; this does 100.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest

from tests.faults.apikeys import MODEL, metric, tenants

pytestmark = pytest.mark.model

STREAMS = 100
AT_ONCE = 10  # clients in flight together (the engine batches them)
MAX_TOKENS = 200  # far more than is read (and the prompt asks for more): cut mid-reply


def drop_one(client: httpx.Client, url: str, key: str, i: int, probe=None) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": MAX_TOKENS, "temperature": 0,
            "messages": [{"role": "user",
                          "content": f"Client {i}: write a long essay, at least 1000 words, "
                                     "about the history of bridges."}]}
    with client.stream("POST", url, json=body,
                       headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200, response.read()
        # Keep the iterator: dropping it closes the connection at once (the probe reads
        # the figures while the generation is still running).
        lines = response.iter_lines()
        first = next(lines)
        assert first.startswith("data: {") and '"error"' not in first, first
        if probe is not None:
            probe()
    # Leaving the block closes the connection while the server is still generating.


def test_a_hundred_dropped_streams_leak_no_block(fault_server):
    keys = tenants(fault_server, "dropper", AT_ONCE, rpm=100000, concurrent=AT_ONCE)
    url = fault_server.url + "/v1/chat/completions"
    # (Read as 0 where no engine is loaded yet: this may be the server's first request.)
    generated_before = metric(fault_server, "generation_tokens_total", required=False)
    aborted_before = metric(fault_server, "request_success_total", required=False,
                            finished_reason="abort")
    # One connection per client: a pooled connection would be reused, not dropped.
    limits = httpx.Limits(max_keepalive_connections=0)
    held: list[float] = []
    with httpx.Client(timeout=120, limits=limits) as client, ThreadPoolExecutor(AT_ONCE) as pool:
        # The first, alone: while it streams, the figures read below do show its blocks.
        drop_one(client, url, keys[0], 0,
                 probe=lambda: held.append(metric(fault_server, "kv_cache_blocks", state="used")))
        list(pool.map(lambda i: drop_one(client, url, keys[i % AT_ONCE], i), range(1, STREAMS)))
    assert held[0] > 0

    # Bounded wait for the aborts to land: then nothing runs and no block is held.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = metric(fault_server, "num_requests_running")
        used = metric(fault_server, "kv_cache_blocks", state="used")
        if running == 0 and used == 0:
            break
        time.sleep(0.25)
    print(f"after {STREAMS} dropped streams: running={running} blocks used={used}, "
          f"{60 - (deadline - time.monotonic()):.1f}s to settle")
    generated = metric(fault_server, "generation_tokens_total") - generated_before
    aborted = metric(fault_server, "request_success_total", finished_reason="abort") - aborted_before
    print(f"{generated:.0f} tokens generated, {aborted:.0f} requests aborted")
    assert (running, used) == (0, 0)
    assert metric(fault_server, "num_requests_waiting") == 0
    # The generations were cut short, not run out to max_tokens.
    assert generated < STREAMS * MAX_TOKENS / 2, generated
    assert aborted >= STREAMS / 2, aborted
