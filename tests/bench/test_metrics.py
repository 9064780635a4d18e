"""The chat benchmarks' arithmetic: percentiles, latencies from timestamps, summaries and
the theoretical ceiling of the cached share. Pure functions: no model, no server."""

import json

import numpy as np
import pytest

import bench
from bench import conversations as wl
from bench import http_client
from bench.metrics import (
    RequestRecord,
    by_turn,
    cacheable_from,
    cacheable_tokens,
    percentile,
    stats,
    summarize,
)


def record(conv=0, turn=1, start=10.0, chunks=(10.5, 10.7, 11.0), end=11.2, **kw) -> RequestRecord:
    kw.setdefault("completion_tokens", 4)
    return RequestRecord(
        conversation=conv,
        turn=turn,
        start=start,
        end=end,
        first_token=chunks[0] if chunks else None,
        chunk_times=list(chunks),
        **kw,
    )


@pytest.mark.parametrize("q", [0, 1, 10, 25, 50, 90, 99, 100])
@pytest.mark.parametrize("values", [[3.0], [4, 1, 3, 2], [0.5, 9.0, 2.2, 2.2, 7.1, 0.01, 3.3]])
def test_percentile_matches_numpys_linear_interpolation(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_refuses_nothing_and_out_of_range():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_stats_skip_missing_values_and_report_none_when_empty():
    s = stats([1.0, None, 3.0])
    assert (
        s["count"] == 2 and s["mean"] == 2.0 and s["p50"] == 2.0 and s["p99"] == pytest.approx(2.98)
    )
    assert stats([None]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_latencies_come_from_the_timestamps():
    r = record()
    assert r.ok
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(1.2)
    # TPOT spreads what follows the first token over the other tokens (4 - 1)...
    assert r.tpot == pytest.approx((1.2 - 0.5) / 3)
    # ...ITL is the gaps between outputs as they arrived (a chunk may hold several tokens).
    assert r.itl == pytest.approx([0.2, 0.3])
    d = r.as_dict()
    assert d["ttft"] == r.ttft and d["chunks"] == 3 and "chunk_times" not in d


def test_one_token_or_no_token_has_no_tpot():
    assert record(completion_tokens=1, chunks=(10.5,)).tpot is None
    empty = record(chunks=(), completion_tokens=0)
    assert empty.ttft is None and empty.tpot is None and empty.itl == []
    failed = record(end=None, error="boom")
    assert not failed.ok and failed.e2e is None


def test_summary_counts_throughput_over_the_run_and_only_successes():
    ok1 = record(prompt_tokens=100, cached_tokens=64, max_cached_tokens=80)
    ok2 = record(
        turn=2,
        start=11.0,
        chunks=(11.1, 11.3),
        end=11.5,
        completion_tokens=2,
        prompt_tokens=200,
        cached_tokens=160,
        max_cached_tokens=176,
    )
    bad = record(end=None, error="HTTP 429", prompt_tokens=50)
    s = summarize([ok1, ok2, bad], duration=2.0)
    assert (s["completed"], s["failed"], s["errors"]) == (2, 1, ["HTTP 429"])
    assert s["request_throughput"] == 1.0
    assert s["output_throughput"] == 3.0  # (4 + 2) tokens / 2 s
    assert s["total_token_throughput"] == (300 + 6) / 2
    assert s["prompt_tokens"] == 300 and s["cached_tokens"] == 224
    assert s["cached_share"] == pytest.approx(224 / 300)
    assert s["max_cached_share"] == pytest.approx(256 / 300)
    assert s["cached_share_of_max"] == pytest.approx(224 / 256)
    assert s["ttft_s"]["count"] == 2 and s["ttft_s"]["mean"] == pytest.approx((0.5 + 0.1) / 2)
    assert s["itl_s"]["count"] == 3  # 2 gaps + 1 gap, pooled


def test_unknown_ceiling_leaves_the_share_of_max_out():
    s = summarize([record(prompt_tokens=10, cached_tokens=0)], 1.0)
    assert s["max_cached_share"] is None and s["cached_share_of_max"] is None


def test_by_turn_groups_ttft_and_cached_share():
    rs = [
        record(conv=c, turn=t, prompt_tokens=100, cached_tokens=0 if t == 1 else 80)
        for c in range(3)
        for t in (1, 2)
    ]
    turns = by_turn(rs)
    assert [t["turn"] for t in turns] == [1, 2]
    assert [t["requests"] for t in turns] == [3, 3]
    assert turns[0]["cached_share"] == 0 and turns[1]["cached_share"] == 0.8
    assert turns[1]["ttft_s"]["p50"] == pytest.approx(0.5)


# --- the theoretical ceiling ------------------------------------------------------
def test_ceiling_is_everything_but_the_new_message_in_whole_blocks():
    assert cacheable_tokens(600, new_tokens=70, history_tokens=None, block_size=16) == 528
    # Not past what the earlier requests computed...
    assert cacheable_tokens(600, 70, history_tokens=500, block_size=16) == 496
    # ...never the last prompt token, whose logits must be computed.
    assert cacheable_tokens(32, 0, None, 16) == 16
    assert cacheable_tokens(40, 50, None, 16) == 0
    assert cacheable_tokens(600, 70, None, block_size=1) == 530


def test_exact_ceiling_is_the_longest_shared_prefix():
    prompt = list(range(40))
    assert cacheable_from(prompt, [[*range(35), 999]], 16) == 32
    assert cacheable_from(prompt, [[7, 8], list(range(20))], 16) == 16
    assert cacheable_from(prompt, [prompt], 16) == 32  # capped at len - 1 = 39
    assert cacheable_from(prompt, [], 16) == 0


def test_serve_ceiling_uses_usage_and_the_new_message():
    work = wl.multiturn(1, 2, system_tokens=40, user_tokens=10, reply_tokens=8)
    t1 = record(turn=1, prompt_tokens=60, completion_tokens=8)
    t2 = record(turn=2, prompt_tokens=85, completion_tokens=8)
    http_client.fill_max_cached([t1, t2], work, overhead=5, block_size=16)
    assert t1.max_cached_tokens == 32  # 60 - (10 + 5) = 45 -> 32 (warm-up holds the system)
    assert t2.max_cached_tokens == 64  # min(85 - 15, 60 + 8 - 1) = 67 -> 64
    http_client.fill_max_cached([t1, t2], work, overhead=5, block_size=16, warmed=False)
    assert t1.max_cached_tokens == 0  # the very first request has nothing before it


# --- workloads ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    from inference.loader import load_tokenizer

    return load_tokenizer()


def texts(work: wl.Workload) -> list:
    return [(c.system, [t.user for t in c.turns]) for c in work.conversations]


def test_workloads_are_deterministic_in_their_seed(tokenizer):
    kw = dict(conversations=3, turns=2, system_tokens=30, user_tokens=12, reply_tokens=4,
              tokenizer=tokenizer)
    for name in wl.WORKLOADS:
        a = wl.build(name, seed=1, **kw)
        b = wl.build(name, seed=1, **kw)
        c = wl.build(name, seed=2, **kw)
        assert texts(a) == texts(b) and texts(a) != texts(c)


def test_token_counts_are_measured_and_on_target(tokenizer):
    work = wl.multiturn(
        4, 3, system_tokens=512, user_tokens=60, reply_tokens=64, tokenizer=tokenizer
    )
    count = wl.token_counter(tokenizer)
    conv = work.conversations[2]
    assert conv.system_tokens == count(conv.system)
    assert abs(conv.system_tokens - 512) <= 1
    for c in work.conversations:
        for t in c.turns:
            assert t.user_tokens == count(t.user) and abs(t.user_tokens - 60) <= 1
    # Without a tokenizer a word stands for a token.
    plain = wl.multiturn(1, 1, 20, 7, 4)
    assert len(plain.conversations[0].turns[0].user.split()) == 7


def test_what_each_workload_shares(tokenizer):
    kw = dict(
        conversations=4,
        turns=3,
        system_tokens=24,
        user_tokens=8,
        reply_tokens=4,
        tokenizer=tokenizer,
    )
    multi = wl.build("multiturn", **kw)
    assert len({c.system for c in multi.conversations}) == 1
    users = [t.user for c in multi.conversations for t in c.turns]
    assert len(set(users)) == len(users) == 12
    prefix = wl.build("prefix", **kw)
    assert len({c.system for c in prefix.conversations}) == 1
    assert all(len(c.turns) == 1 for c in prefix.conversations)
    rand = wl.build("random", **kw)
    assert len({c.system for c in rand.conversations}) == 4
    assert len({c.turns[0].user for c in rand.conversations}) == 4
    assert multi.num_requests == 12 and prefix.num_requests == rand.num_requests == 4


def test_turn_messages_carry_the_replies_given():
    conv = wl.multiturn(1, 3, 10, 5, 4).conversations[0]
    first = conv.messages([])
    assert [m["role"] for m in first] == ["system", "user"]
    third = conv.messages(["reply one", "reply two"])
    assert [m["role"] for m in third] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert third[2]["content"] == "reply one" and third[4]["content"] == "reply two"
    assert third[5]["content"] == conv.turns[2].user
    with pytest.raises(IndexError):
        conv.messages(["a", "b", "c"])


def test_system_prompt_is_cacheable_only_once_seen():
    multi = wl.multiturn(3, 1, 10, 5, 4)
    assert multi.system_seen_before(0) and multi.system_seen_before(2)
    assert not multi.system_seen_before(0, warmed=False) and multi.system_seen_before(1, False)
    rand = wl.random_requests(3, 10, 5, 4)
    assert not any(rand.system_seen_before(i) for i in range(3))


def test_jsonl_conversations(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text(
        '[{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi there"},'
        ' {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and now"}]\n'
        "\n"
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "one two three"}]}]}\n'
        '[{"role": "assistant", "content": "no user here"}]\n'
    )
    work = wl.load_jsonl(path, reply_tokens=5)
    assert work.name == "jsonl" and work.reply_tokens == 5
    a, b = work.conversations
    assert a.system == "Be kind." and [t.user for t in a.turns] == ["hi there", "and now"]
    assert [t.user_tokens for t in a.turns] == [2, 2]  # words, without a tokenizer
    assert b.system is None and b.turns[0].user == "one two three"
    assert a.messages(["server reply"])[2] == {"role": "assistant", "content": "server reply"}
    assert len(wl.load_jsonl(path, 5, limit=1).conversations) == 1

    bad = tmp_path / "bad.jsonl"
    bad.write_text('[{"role": "user", "content": "fine"}]\n{not json\n')
    with pytest.raises(ValueError, match=":2:"):
        wl.load_jsonl(bad, 5)


def test_template_overhead_counts_the_wrapping_of_a_user_turn(tokenizer):
    # ChatML: <|im_start|>user\n ... <|im_end|>\n<|im_start|>assistant\n
    assert wl.template_overhead(tokenizer) == 9
    assert wl.template_overhead(None) == 0


def test_plot_subcommand_overlays_result_files(tmp_path):
    pytest.importorskip("matplotlib")
    turns = [{"turn": t, "ttft_s": {"p50": 0.1 * t, "p90": 0.2 * t}} for t in (1, 2, 3)]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"by_turn": turns}))
    b.write_text(
        json.dumps({"systems": {"cache_on": {"by_turn": turns}, "cache_off": {"by_turn": turns}}})
    )
    out = tmp_path / "ttft.png"
    assert bench.main(["plot", str(a), str(b), "--out", str(out)]) == out
    assert out.read_bytes()[:4] == b"\x89PNG"
