"""The host/disk KV tier: offload on eviction, restore on lookup, persistence across
restarts, prewarm, and each request's prefix-cache receipt (why its match ended)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time

import pytest
import torch

from inference import AsyncEngine, SamplingParams
from inference.async_engine import _Prewarm
from inference.kv_offload import MAGIC, SUFFIX
from inference.sequence import Sequence

ONE = SamplingParams(max_tokens=1, temperature=0)
BS = 16


def rand_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49000) for _ in range(n)]


def run(engine, prompt, salt=None):
    [[out]] = engine.generate([prompt], ONE, cache_salt=salt)
    return out


def evict_everything(engine, seed: int = 99) -> None:
    """A prompt that needs every block of the pool: every cached block is evicted."""
    n = engine.kv.pool.num_blocks * BS - 8
    run(engine, rand_ids(n, seed))


def logits_after_cache(engine, ids: list[int]) -> tuple[int, torch.Tensor]:
    """(cached tokens, fp32 logits of every position computed) for one prompt."""
    seq = Sequence("logits", 0, ids, SamplingParams())
    hits = engine.kv.find_cached_blocks(seq)
    n = len(ids) - len(hits) * BS
    engine.kv.admit(seq, hits, n)
    logits = engine.runner.full_logits([seq], [n])
    seq.num_computed_tokens += n
    engine.kv.cache_computed_blocks(seq)
    engine.kv.free(seq)
    return len(hits) * BS, logits


@pytest.fixture
def tiered(make_engine):
    def build(**kw):
        kw.setdefault("num_blocks", 12)
        kw.setdefault("kv_offload_bytes", 1 << 20)
        return make_engine(**kw)

    return build


def test_evicted_chain_is_served_from_the_tier_with_the_same_logits(tiered, make_engine):
    engine = tiered()
    prompt = rand_ids(64, 1)
    run(engine, prompt + [5])
    evict_everything(engine)
    assert engine.kv.pool.lookup(_hashes(engine, prompt)[0]) is None
    ids = prompt + rand_ids(20, 2)
    cached, restored = logits_after_cache(engine, ids)
    assert cached == 64
    snap = engine.metrics_snapshot()
    assert snap["kv_tier_restores"] == 4 and snap["kv_tier_offloads"] >= 4
    fresh = make_engine(enable_prefix_caching=False)
    _, ref = logits_after_cache(fresh, ids)
    assert (restored - ref[cached:]).abs().max().item() <= 1e-5

    # Through the engine: the receipt says the blocks came from the tier.
    engine2 = tiered()
    run(engine2, prompt + [5])
    evict_everything(engine2)
    out = run(engine2, prompt + [7])
    assert out.cached_tokens == 64
    assert out.prefix_cache.tier_tokens == 64
    assert out.prefix_cache.matched_tokens == 64 and out.prefix_cache.reason == "full"
    snap = engine2.metrics_snapshot()
    assert snap["prefix_cache_hits_tier"] == 64
    assert snap["prefix_cache_hits_pool"] + 64 == snap["prefix_cache_hits"]
    assert snap["kv_tier_memory_blocks"] > 0 and snap["kv_tier_memory_bytes"] > 0
    assert snap["kv_tier_restore_seconds"]["count"] >= 1


def _hashes(engine, ids, salt=None):
    seq = Sequence("h", 0, ids, SamplingParams(), salt)
    engine.kv.update_block_hashes(seq)
    return seq.block_hashes


def test_tier_memory_stays_within_its_budget(tiered):
    engine = tiered()
    block_bytes = engine.kv_tier.block_bytes
    engine = tiered(kv_offload_bytes=3 * block_bytes)
    for seed in range(4):
        run(engine, rand_ids(64, seed) + [5])
    evict_everything(engine)
    snap = engine.metrics_snapshot()
    assert snap["kv_tier_memory_blocks"] == 3
    assert snap["kv_tier_memory_bytes"] <= 3 * block_bytes


def test_a_salted_request_never_restores_another_salts_block(tiered):
    engine = tiered()
    prompt = rand_ids(64, 3)
    run(engine, prompt + [5], salt="tenant-a")
    evict_everything(engine)
    restores = engine.metrics_snapshot()["kv_tier_restores"]
    for salt in ("tenant-b", None):
        out = run(engine, prompt + [5], salt=salt)
        assert out.cached_tokens == 0 and out.prefix_cache.tier_tokens == 0
        assert out.prefix_cache.reason == "cold"  # its own history: nothing
        assert engine.metrics_snapshot()["kv_tier_restores"] == restores
    evict_everything(engine, seed=98)
    out = run(engine, prompt + [5], salt="tenant-a")
    assert out.cached_tokens == 64 and out.prefix_cache.tier_tokens == 64


def test_a_restarted_engine_on_the_same_kv_dir_hits(tiered, tmp_path):
    prompt = rand_ids(80, 4)
    first = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path))
    run(first, prompt + [5])
    first.close()  # the pool's blocks go to disk too
    assert len(list(tmp_path.glob("*" + SUFFIX))) >= 5
    del first
    second = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path))
    # What the restarted engine reads back gives the same logits as computing afresh.
    ids = prompt + rand_ids(10, 12)
    cached, restored = logits_after_cache(second, ids)
    assert cached == 80
    _, ref = logits_after_cache(tiered(enable_prefix_caching=False), ids)
    assert (restored - ref[cached:]).abs().max().item() <= 1e-5
    out = run(second, prompt + [6])
    assert out.cached_tokens == 80
    assert out.prefix_cache.tier_tokens == 0  # restored above, by the logits check
    second.reset_prefix_cache()
    assert not list(tmp_path.glob("*" + SUFFIX))  # reset forgets the disk too
    second = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path))
    run(second, prompt + [5])
    second.close()
    second = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path))
    out = run(second, prompt + [6])
    assert out.cached_tokens == 80
    assert out.prefix_cache.tier_tokens == 80
    assert second.metrics_snapshot()["kv_tier_disk_blocks"] >= 5
    # Memory and disk together: evictions write through to disk as well.
    third = tiered(kv_dir=str(tmp_path / "b"))
    run(third, prompt + [5])
    evict_everything(third)
    assert third.metrics_snapshot()["kv_tier_disk_blocks"] >= 5
    fourth = tiered(kv_dir=str(tmp_path / "b"))
    assert run(fourth, prompt + [5]).prefix_cache.tier_tokens == 80


def test_disk_tier_stays_within_its_budget(tiered, tmp_path):
    probe = tiered()
    budget = 3 * (probe.kv_tier.block_bytes + 1024)
    engine = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path), kv_dir_bytes=budget)
    for seed in range(3):
        run(engine, rand_ids(64, seed) + [5])
    evict_everything(engine)
    engine.close()
    files = list(tmp_path.glob("*" + SUFFIX))
    assert len(files) <= 3
    assert sum(f.stat().st_size for f in files) <= budget


def _rewrite_header(path, **changes):
    data = path.read_bytes()
    n = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    header = json.loads(data[start : start + n])
    header.update(changes)
    head = json.dumps(header, sort_keys=True).encode()
    path.write_bytes(MAGIC + len(head).to_bytes(4, "little") + head + data[start + n :])


def test_corrupt_and_foreign_files_are_skipped_with_a_warning(tiered, tmp_path, caplog):
    prompt = rand_ids(64, 5)
    first = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path))
    run(first, prompt + [5])
    first.close()
    hashes = _hashes(first, prompt)
    del first
    paths = [tmp_path / (h.hex() + SUFFIX) for h in hashes]
    assert all(p.exists() for p in paths)
    # Block 2 is corrupt (a flipped payload byte); block 3 claims another model.
    data = bytearray(paths[2].read_bytes())
    data[-5] ^= 0xFF
    paths[2].write_bytes(bytes(data))
    _rewrite_header(paths[3], model_id="some/other/model:float32")
    (tmp_path / ("ab" * 16 + SUFFIX)).write_bytes(b"not a block at all")

    with caplog.at_level(logging.WARNING, logger="inference.kv_offload"):
        second = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path))
        assert any("model_id" in r.getMessage() for r in caplog.records)
        assert any("not a KV block file" in r.getMessage() for r in caplog.records)
        out = run(second, prompt + [5])
        assert any("checksum" in r.getMessage() for r in caplog.records)
    # Blocks 0 and 1 restore; the corrupt block 2 ends the run and is recomputed.
    assert out.prefix_cache.tier_tokens == 32
    assert out.cached_tokens == 32
    assert second.metrics_snapshot()["kv_tier_disk_files_skipped"] >= 3


def test_a_foreign_dtype_directory_is_never_loaded(tiered, tmp_path, caplog):
    prompt = rand_ids(64, 6)
    fp32 = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path))
    run(fp32, prompt + [5])
    fp32.close()
    with caplog.at_level(logging.WARNING, logger="inference.kv_offload"):
        bf16 = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path), dtype="bfloat16")
    assert bf16.metrics_snapshot()["kv_tier_disk_blocks"] == 0
    assert any("skipping" in r.getMessage() for r in caplog.records)
    out = run(bf16, prompt + [5])
    assert out.cached_tokens == 0 and out.prefix_cache.reason == "cold"


def test_each_miss_reason_in_the_situation_it_names(tiered, make_engine):
    prompt = rand_ids(64, 7)
    engine = make_engine(num_blocks=12)  # no tier
    assert run(engine, prompt + [5]).prefix_cache.reason == "cold"
    full = run(engine, prompt + [6]).prefix_cache
    assert (full.reason, full.matched_tokens, full.tier_tokens) == ("full", 64, 0)
    # A partial hit: the shared first two blocks hit, the third was never computed.
    other = run(engine, prompt[:32] + rand_ids(40, 8)).prefix_cache
    assert (other.reason, other.matched_tokens) == ("cold", 32)
    evict_everything(engine)
    evicted = run(engine, prompt + [5]).prefix_cache
    assert (evicted.reason, evicted.evicted_from) == ("evicted", "pool")
    # Cached without a salt, asked with one (and under another one): "cold" for the
    # request, which learns nothing of other tenants; "salt" only in the aggregate.
    assert run(engine, prompt + [5], salt="s1").prefix_cache.reason == "cold"
    assert run(engine, prompt + [5], salt="s2").prefix_cache.reason == "cold"

    # Evicted from the tier too: a tier of one block cannot keep the chain.
    small = tiered()
    small = tiered(kv_offload_bytes=small.kv_tier.block_bytes)
    run(small, prompt + [5])
    evict_everything(small)
    gone = run(small, prompt + [5]).prefix_cache
    assert (gone.reason, gone.evicted_from) == ("evicted", "tier")

    off = make_engine(enable_prefix_caching=False)
    assert run(off, prompt + [5]).prefix_cache.reason == "disabled"
    reasons = engine.metrics_snapshot()["prefix_cache_miss_reasons"]
    assert reasons["cold"] >= 1 and reasons["full"] == 1 and reasons["evicted_pool"] == 1
    assert reasons["salt"] == 2  # the admin's aggregate still counts cross-tenant misses


def test_prewarm_brings_blocks_back_and_the_next_request_counts_them(tiered):
    engine = tiered()
    prompt = rand_ids(80, 9)
    run(engine, prompt + [5])
    evict_everything(engine)
    assert engine.prewarm(prompt, max_blocks=2) == 2  # bounded work per call
    assert engine.prewarm(prompt) == 3
    assert engine.prewarm(prompt) == 0  # already in the pool
    restores = engine.metrics_snapshot()["kv_tier_restores"]
    assert engine.metrics_snapshot()["blocks_cached_free"] >= 5
    out = run(engine, prompt + [5])
    assert out.cached_tokens == 80
    assert out.prefix_cache.tier_tokens == 80  # restored ahead, served as tier hits
    assert engine.metrics_snapshot()["kv_tier_restores"] == restores
    # Without a tier there is nothing to bring back.
    plain = tiered(kv_offload_bytes=0)
    assert plain.prewarm(prompt) == 0


def test_async_prewarm_skips_a_superseded_or_abandoned_call(tiered):
    engine = tiered()
    prompt = rand_ids(80, 10)
    run(engine, prompt + [5])
    evict_everything(engine)
    aengine = AsyncEngine(engine=engine)
    aengine.shutdown()  # its step thread stops; the slices run here, in a known order

    async def main():
        loop = asyncio.get_running_loop()
        old, new = _Prewarm(loop, "conv"), _Prewarm(loop, "conv")
        aengine._prewarms["conv"] = new  # a later call with the same key
        aengine._pending_prewarms.extend([[old, prompt, None, 64, 0], [new, prompt, None, 64, 0]])
        new.cancelled = True  # its caller stopped waiting
        aengine._prewarm_slice()
        aengine._prewarm_slice()
        return await old.future, await new.future

    assert asyncio.run(main()) == (0, 0)
    assert engine.metrics_snapshot()["kv_tier_restores"] == 0


def test_async_prewarm_runs_in_slices_on_the_step_thread(tiered):
    engine = tiered()
    prompt = rand_ids(80, 11)
    run(engine, prompt + [5])
    evict_everything(engine)
    aengine = AsyncEngine(engine=engine)
    aengine.PREWARM_SLICE = 2  # 2 + 2 + 1 blocks, between steps
    try:
        assert asyncio.run(aengine.prewarm(prompt)) == 5
        snap = engine.metrics_snapshot()
        assert snap["kv_tier_restores"] == 5
        assert snap["kv_tier_restore_seconds"]["count"] == 3  # one restore per slice
    finally:
        aengine.shutdown()


def test_an_idle_async_engine_writes_its_pool_to_kv_dir_once(tiered, tmp_path, monkeypatch):
    """Idle, the step thread saves what the pool holds (a crash then loses little), 16
    blocks a pass; once all is saved it scans nothing until the engine steps again."""
    engine = tiered(kv_offload_bytes=0, kv_dir=str(tmp_path))
    passes = []
    persist = engine.persist_kv
    monkeypatch.setattr(engine, "persist_kv", lambda **kw: passes.append(persist(**kw))
                        or passes[-1])
    aengine = AsyncEngine(engine=engine)
    try:
        async def main():
            async for _ in aengine.generate(rand_ids(80, 12), ONE):
                pass

        asyncio.run(main())
        deadline = time.monotonic() + 30
        while sum(passes) < 80 // BS or passes[-1] == 16:  # until all is saved
            assert time.monotonic() < deadline, passes
            time.sleep(0.05)
        done = len(passes)
        time.sleep(1.2)  # two more idle waits: nothing left to scan
        assert len(passes) == done, passes
        assert sum(passes) == len(list(tmp_path.glob("*.kv"))) >= 80 // BS
    finally:
        aengine.shutdown()


def test_an_int8_pool_round_trips_through_memory_and_disk(tiered, make_engine, tmp_path,
                                                          caplog):
    """int8 rows (kernels/kv_quant) leave and come back as the bytes they were: the
    restored blocks give the logits a fresh int8 engine computes; a bf16 pool's
    directory is never read into an int8 one."""
    engine = tiered(kv_dtype="int8", kv_dir=str(tmp_path / "int8"))
    assert engine.runner.kv_cache.dtype == torch.uint8
    assert engine.kv_tier.block_bytes == engine.runner.kv_cache[:, :, 0].nbytes
    prompt = rand_ids(64, 21)
    run(engine, prompt + [5])
    evict_everything(engine)
    ids = prompt + rand_ids(20, 22)
    cached, restored = logits_after_cache(engine, ids)
    assert cached == 64 and engine.metrics_snapshot()["kv_tier_restores"] == 4
    _, ref = logits_after_cache(make_engine(kv_dtype="int8", enable_prefix_caching=False), ids)
    # The same rows: equal logits but where a K/V value of the two prefills' fp32 sums
    # lies by a rounding edge (one int8 step apart).
    torch.testing.assert_close(restored, ref[cached:], rtol=0, atol=1e-3)
    engine.close()
    again = tiered(kv_dtype="int8", kv_offload_bytes=0, kv_dir=str(tmp_path / "int8"))
    assert run(again, prompt + [6]).prefix_cache.tier_tokens == 64
    bf16 = tiered(kv_dtype="bfloat16", kv_offload_bytes=0, kv_dir=str(tmp_path / "bf16"))
    run(bf16, prompt + [5])
    bf16.close()
    with caplog.at_level(logging.WARNING, logger="inference.kv_offload"):
        other = tiered(kv_dtype="int8", kv_offload_bytes=0, kv_dir=str(tmp_path / "bf16"))
    assert other.metrics_snapshot()["kv_tier_disk_blocks"] == 0
    assert run(other, prompt + [5]).prefix_cache.reason == "cold"
