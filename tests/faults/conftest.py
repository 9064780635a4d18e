"""The fault suite: hostile input, tenant privacy, dropped streams and crashes, each
against a live daphne process (tests/chatapp/e2e/conftest.py starts it)."""

from __future__ import annotations

import pytest

from tests.chatapp.e2e.conftest import start_live_server, stop_live_server


@pytest.fixture(scope="session")
def fault_server(tmp_path_factory):
    """One live server (the model loads once) for the tests that do not kill it."""
    live, proc = start_live_server(
        tmp_path_factory.mktemp("faults"), "faults",
        CHAT_MAX_NEW_TOKENS="64",
        # Short, for the test of a body that never arrives.
        REQUEST_BODY_TIMEOUT_S="3",
    )
    yield live
    stop_live_server(proc)
