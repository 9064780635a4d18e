"""Requests that arrive together with a shared prefix compute it once: a waiting
request whose next blocks a scheduled request is computing shares them as soon as
they are complete, in the same step or a later one (inference/inflight.py)."""

import pytest

from inference import SamplingParams
from tests.inference.test_prefix_cache import rand_ids

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
PREFIX = rand_ids(160, 0)  # 10 whole blocks


def prompts(n: int, prefix: list[int] = PREFIX) -> list[list[int]]:
    return [prefix + rand_ids(9 + 3 * i, 100 + i) for i in range(n)]


def count_prompt_tokens(engine, monkeypatch) -> list[int]:
    """Prompt tokens each step computes (decode tokens not counted)."""
    per_step: list[int] = []
    real = engine.runner.execute

    def execute(seqs, num_tokens, scoring=None):
        per_step.append(sum(
            min(n, max(0, s.num_prompt_tokens - s.num_computed_tokens))
            for s, n in zip(seqs, num_tokens, strict=True)
        ))
        return real(seqs, num_tokens, scoring)

    monkeypatch.setattr(engine.runner, "execute", execute)
    return per_step


def one_at_a_time(make_engine, batch: list[list[int]], params=GREEDY) -> list[list[int]]:
    engine = make_engine()
    return [engine.generate([p], params)[0][0].token_ids for p in batch]


def run_all(engine, batch, params=GREEDY, salts=None):
    ids = [f"r{i}" for i in range(len(batch))]
    for i, (rid, p) in enumerate(zip(ids, batch, strict=True)):
        engine.add_request(rid, p, params, cache_salt=salts[i] if salts else None)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[rid] for rid in ids]


@pytest.mark.parametrize("budget", [4096, 48], ids=["one-step", "chunked"])
def test_simultaneous_requests_compute_a_shared_prefix_once(make_engine, monkeypatch, budget):
    batch = prompts(6)
    engine = make_engine(max_num_batched_tokens=budget)
    computed = count_prompt_tokens(engine, monkeypatch)
    outs = run_all(engine, batch)
    suffixes = sum(len(p) - len(PREFIX) for p in batch)
    assert sum(computed) == len(PREFIX) + suffixes
    assert [o.cached_tokens for o in outs] == [0] + [len(PREFIX)] * 5
    if budget == 4096:  # all in the first step, sharing the blocks it writes
        assert engine.scheduler.num_inflight_shared_blocks == 5 * len(PREFIX) // 16
        assert engine.metrics_snapshot()["inflight_shared_blocks"] == 5 * len(PREFIX) // 16
    assert [o.token_ids for o in outs] == one_at_a_time(make_engine, batch)
    assert engine.metrics_snapshot()["blocks_used"] == 0


def test_without_waiting_each_request_computes_the_prefix(make_engine, monkeypatch):
    """What the waiting saves: the same batch with prefix caching off computes the
    prefix once per request."""
    batch = prompts(6)
    engine = make_engine(max_num_batched_tokens=4096, enable_prefix_caching=False)
    computed = count_prompt_tokens(engine, monkeypatch)
    run_all(engine, batch)
    assert sum(computed) == sum(map(len, batch))
    assert engine.scheduler.num_prefix_waits == 0


def test_the_waiter_goes_on_alone_when_the_producer_is_aborted(make_engine):
    batch = prompts(4)
    engine = make_engine(max_num_batched_tokens=48)
    for i, p in enumerate(batch):
        engine.add_request(f"r{i}", p, GREEDY)
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["r0"]
    assert [s.request_id for s in engine.scheduler.waiting] == ["r1", "r2", "r3"]
    engine.abort("r0")
    engine.step()
    # r1 takes over: it hits the 48 tokens r0 cached and computes the rest; the others
    # now wait for r1.
    assert [s.request_id for s in engine.scheduler.running] == ["r1"]
    assert engine.requests["r1"][0].num_cached_tokens == 48
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.token_ids
    expected = one_at_a_time(make_engine, batch[1:])
    assert [final[f"r{i}"] for i in (1, 2, 3)] == expected
    assert engine.metrics_snapshot()["blocks_used"] == 0


def test_requests_with_different_salts_never_wait_on_each_other(make_engine, monkeypatch):
    batch = [PREFIX + rand_ids(10, 7)] * 3
    engine = make_engine(max_num_batched_tokens=4096)
    computed = count_prompt_tokens(engine, monkeypatch)
    outs = run_all(engine, batch, salts=["a", "b", None])
    assert engine.scheduler.num_prefix_waits == 0
    assert engine.scheduler.num_inflight_shared_blocks == 0
    assert computed[0] == 3 * len(batch[0])  # all three in the first step
    assert [o.cached_tokens for o in outs] == [0, 0, 0]
    assert len({tuple(o.token_ids) for o in outs}) == 1


def test_a_waiter_waits_for_blocks_written_later_and_others_go_ahead(make_engine):
    """a's prefill is chunked; were budget left in its step, b, which needs a block
    that a writes in a later chunk, waits, while c, which shares nothing, is
    admitted (FCFS otherwise). (With this scheduler a prefill chunk only leaves
    budget when it is the prompt's last, so the step is completed by hand.)"""
    engine = make_engine(max_num_batched_tokens=48)
    batch = [PREFIX + rand_ids(5, 1), PREFIX + rand_ids(5, 2), rand_ids(30, 3)]
    for rid, p in zip("abc", batch, strict=True):
        engine.add_request(rid, p, GREEDY)
    sched = engine.scheduler
    out = sched.schedule()
    assert [s.request_id for s in out.seqs] == ["a"] and out.num_tokens == [48]
    sched._admit_waiting(out, 100)  # as if 100 tokens of budget were left
    assert [s.request_id for s in out.seqs] == ["a", "c"]
    assert [s.request_id for s in sched.waiting] == ["b"]
    assert sched.num_prefix_waits == 1
    assert engine.metrics_snapshot()["prefix_waits"] == 1
    final = {}
    while engine.has_unfinished_requests():  # c's first chunk is computed next step
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    assert final["b"].cached_tokens == len(PREFIX)
    assert [final[r].token_ids for r in "abc"] == one_at_a_time(make_engine, batch)


def test_a_request_that_shares_nothing_is_not_held_back(make_engine):
    engine = make_engine(max_num_batched_tokens=4096)
    engine.add_request("a", PREFIX + rand_ids(5, 1), GREEDY)
    engine.add_request("b", PREFIX + rand_ids(5, 2), GREEDY)
    engine.add_request("c", rand_ids(170, 3), GREEDY)
    engine.step()
    # b shares the blocks a writes in this very step.
    assert [s.request_id for s in engine.scheduler.running] == ["a", "b", "c"]
    assert engine.requests["b"][0].num_cached_tokens == len(PREFIX)
    assert engine.requests["c"][0].num_cached_tokens == 0


def test_preempted_producers_never_leave_waiters_stuck(make_engine):
    """A pool too small for the batch preempts producers while others wait on them:
    every request still finishes with the output it has alone."""
    batch = prompts(8, rand_ids(64, 5))
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    engine = make_engine(num_blocks=20, max_num_batched_tokens=48)
    outs = run_all(engine, batch, params)
    assert engine.metrics_snapshot()["preemptions"] > 0
    assert engine.scheduler.num_inflight_shared_blocks > 0
    assert [o.token_ids for o in outs] == one_at_a_time(make_engine, batch, params)
    assert engine.metrics_snapshot()["blocks_used"] == 0


def test_a_waiter_starts_once_the_part_it_shares_is_cached(make_engine):
    """Chunked: b shares a's first 5 blocks only. It starts in the first step with
    budget to spare (a's last chunk), although blocks of a's prompt are still being
    computed then: none of them is one b needs."""
    engine = make_engine(max_num_batched_tokens=64)
    engine.add_request("a", PREFIX + rand_ids(5, 1), GREEDY)
    engine.add_request("b", PREFIX[:80] + rand_ids(40, 2), GREEDY)
    engine.step()  # a: tokens 0..63
    engine.step()  # a: 64..127, covering b's shared 80
    assert [s.request_id for s in engine.scheduler.waiting] == ["b"]
    engine.step()  # a: 128..164, b: 27 tokens after its 80 cached
    b = engine.requests["b"][0]
    assert b.num_cached_tokens == 80 and b.num_computed_tokens == 80 + 27
    assert engine.scheduler.num_prefix_waits == 0  # budget, not a producer, held b back
