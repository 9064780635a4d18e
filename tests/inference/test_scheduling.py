"""Preemption, chunked prefill, and leak-free aborts."""

import random

import pytest

from inference import SamplingParams
from tests.inference.test_prefix_cache import rand_ids


def test_preempted_requests_finish_with_unchanged_greedy_output(make_engine):
    prompts = [rand_ids(40 + 7 * i, 100 + i) for i in range(8)]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    roomy = make_engine(num_blocks=256)
    expected = [o[0].token_ids for o in roomy.generate(prompts, params)]

    # 8 requests need ~8 x 7 blocks at their longest; 24 blocks force preemption.
    tight = make_engine(num_blocks=24, max_num_batched_tokens=64)
    got = [o[0].token_ids for o in tight.generate(prompts, params)]
    assert tight.metrics_snapshot()["preemptions"] > 0
    assert got == expected
    snap = tight.metrics_snapshot()
    assert snap["blocks_used"] == 0


def test_chunked_prefill_runs_beside_decodes(make_engine):
    engine = make_engine(max_num_batched_tokens=32)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    engine.add_request("short", rand_ids(10, 1), params)
    engine.step()  # short is prefilled and now decodes
    engine.add_request("long", rand_ids(200, 2), params)
    mixed_steps = 0
    while engine.has_unfinished_requests():
        sched_before = {s.request_id: s.num_computed_tokens for s in engine.scheduler.running}
        engine.step()
        running = {s.request_id: s for s in engine.scheduler.running}
        if "long" in running and "short" in running and "short" in sched_before:
            long_seq = running["long"]
            if 0 < long_seq.num_computed_tokens < long_seq.num_prompt_tokens:
                mixed_steps += 1
    # The 200-token prompt took several 31-token chunks while "short" kept decoding.
    assert mixed_steps >= 3


def test_random_aborts_leave_no_block_in_use(make_engine):
    engine = make_engine(num_blocks=96, max_num_seqs=16, max_num_batched_tokens=128)
    rng = random.Random(0)
    live: list[str] = []
    added = aborted = 0
    phases = {"waiting": 0, "prefill": 0, "decode": 0}
    while added < 500 or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 6)):
            if added < 500:
                rid = f"r{added}"
                prefix = rand_ids(16 * rng.randint(0, 3), rng.randint(0, 3))  # some sharing
                engine.add_request(rid, prefix + rand_ids(rng.randint(1, 60), added),
                                   SamplingParams(max_tokens=rng.randint(1, 12), temperature=0.8,
                                                  seed=added, ignore_eos=True),
                                   cache_salt=rng.choice([None, "x"]))
                live.append(rid)
                added += 1
        for rid in list(live):
            seqs = engine.requests.get(rid)
            if not seqs:
                live.remove(rid)
                continue
            if rng.random() < 0.08:
                s = seqs[0]
                phase = ("waiting" if not s.block_table else
                         "prefill" if s.num_computed_tokens < s.num_prompt_tokens else "decode")
                phases[phase] += 1
                outs = engine.abort(rid)
                assert outs and all(o.finish_reason == "abort" and o.finished for o in outs)
                live.remove(rid)
                aborted += 1
        engine.step()
    assert aborted > 20 and all(phases.values()), phases
    snap = engine.metrics_snapshot()
    assert snap["blocks_used"] == 0
    assert snap["blocks_free"] + snap["blocks_cached_free"] == snap["blocks_total"]
    assert not engine.requests and snap["num_running"] == snap["num_waiting"] == 0


def test_step_budget_defaults_to_256_tokens_on_cpu():
    """On CPU a step is at most 256 tokens by default, so a long prompt is chunked and
    running decodes wait for at most one such chunk."""
    from inference.config import EngineConfig

    assert EngineConfig().max_num_batched_tokens == 256
    assert EngineConfig(device="cuda").max_num_batched_tokens == 2048
    assert EngineConfig(max_num_batched_tokens=64).max_num_batched_tokens == 64


def test_a_step_of_one_sequence_takes_the_lone_budget():
    """By default a step holding a single sequence may compute 1,024 tokens on CPU; an
    explicit max_num_batched_tokens caps every step unless lone_prefill_tokens is set."""
    from inference.config import EngineConfig

    assert EngineConfig().lone_prefill_tokens == 1024
    assert EngineConfig(device="cuda").lone_prefill_tokens == 2048
    assert EngineConfig(max_num_batched_tokens=64).lone_prefill_tokens == 64
    assert EngineConfig(max_num_batched_tokens=64, lone_prefill_tokens=512).lone_prefill_tokens == 512
    with pytest.raises(ValueError, match="lone_prefill_tokens"):
        EngineConfig(max_num_batched_tokens=64, lone_prefill_tokens=32)


def test_a_lone_prompt_is_computed_in_bigger_chunks_than_company_allows(make_engine):
    engine = make_engine(max_num_batched_tokens=64, lone_prefill_tokens=256)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine.add_request("lone", rand_ids(300, 1), params)
    engine.step()
    assert engine.requests["lone"][0].num_computed_tokens == 256
    engine.add_request("second", rand_ids(300, 2), params)
    before = {s.request_id: s.num_computed_tokens for s in engine.scheduler.running}
    engine.step()
    # Two sequences: the step is back to max_num_batched_tokens in all.
    computed = sum(s.num_computed_tokens - before.get(s.request_id, 0)
                   for s in engine.scheduler.running)
    assert computed == 64
    while engine.has_unfinished_requests():
        engine.step()


def test_a_lone_prompt_in_one_chunk_answers_as_in_many(make_engine):
    prompt = rand_ids(300, 3)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    chunked = make_engine(max_num_batched_tokens=32).generate([prompt], params)
    whole = make_engine(max_num_batched_tokens=32, lone_prefill_tokens=512).generate([prompt], params)
    assert whole[0][0].token_ids == chunked[0][0].token_ids
