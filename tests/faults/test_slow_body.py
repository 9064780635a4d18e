"""A request whose body never finishes arriving is answered 408 and closed by the
server `make run` starts (daphne), within REQUEST_BODY_TIMEOUT_S (3 s here)."""

from __future__ import annotations

import socket
import time

import pytest

pytestmark = pytest.mark.model


def send_then_wait(url: str, head: bytes, body: bytes) -> tuple[bytes, float]:
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head + body)
        chunks = []
        while chunk := sock.recv(65536):  # until the server closes
            chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - start


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/conversations/"])
def test_a_body_shorter_than_its_content_length_is_a_408(fault_server, path):
    head = (f"POST {path} HTTP/1.1\r\nHost: {fault_server.host}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
    answer, took = send_then_wait(fault_server.url, head, b'{"model": "x"')
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"request_timeout"' in answer
    assert 2.5 < took < 15


def test_a_complete_body_is_not_timed_out(fault_server):
    body = b'{"title": "x"}'
    head = (f"POST /api/conversations/ HTTP/1.1\r\nHost: {fault_server.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    answer, _ = send_then_wait(fault_server.url, head, body)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]  # no credentials: refused, in time
