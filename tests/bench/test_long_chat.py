"""`python -m bench long-chat`'s runs against a live daphne serving the 2-layer random
model with a 384-token context: behaviour only. Every turn answers both ways; ours'
full recomputes are exactly its cuts, the trimming client's come nearly every turn once
the conversation is longer than the context."""

from __future__ import annotations

import pytest

from bench import long_chat
from bench.servers import Server
from tests.bench.test_serve import api_key
from tests.chatapp.e2e.conftest import start_live_server, stop_live_server

CONTEXT = 384


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    live, proc = start_live_server(
        tmp_path_factory.mktemp("long-chat-live"), "long-chat", API_RATE_LIMIT_RPM="100000",
        LLM_PRELOAD="1", LLM_MODEL=str(tiny_model), LLM_DTYPE="float32",
        LLM_MAX_MODEL_LEN=str(CONTEXT))
    yield Server("live", live.url, proc, live.log, 0.0, api_key(live))
    stop_live_server(proc)


def count(text: str) -> int:
    return len(text.split())  # words: the client's trimming only needs a fair estimate


def test_ours_misses_once_per_cut_and_the_trimming_client_nearly_every_turn(server):
    from bench.conversations import token_counter
    from bench.http_client import load_client_tokenizer

    tokens = token_counter(load_client_tokenizer("smollm2-135m-instruct"))
    users = [f"{n + 1}. " + " ".join(["tell me more about the river"] * 4) for n in range(24)]
    ours = long_chat.run_policy("ours", server, [users], 16, CONTEXT, tokens)
    trimming = long_chat.run_policy("trimming", server, [users], 16, CONTEXT, tokens)
    for run in (ours, trimming):
        assert run["answered"] == run["turns"] == 24, run["rows"][-1]
    assert ours["cuts"] >= 2 and ours["recomputes"] == ours["cuts"]
    cut_turns = [r["turn"] for r in ours["rows"] if r["cut"]]
    assert cut_turns == [r["turn"] for r in ours["rows"] if r["recompute"]]
    assert trimming["recomputes"] > 2 * ours["recomputes"]
    assert ours["cached_share"] > trimming["cached_share"]


def test_the_trimming_client_keeps_the_system_message_and_the_newest_that_fit():
    messages = [{"role": "system", "content": "s"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "w " * 10} for i in range(9)]
    kept = long_chat.trimmed(messages, 40, count)
    assert kept[0] == messages[0] and kept[1:] == messages[-2:]
    assert long_chat.trimmed(messages, 10_000, count) == messages
