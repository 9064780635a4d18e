"""Smoke test of `python -m bench offload` on the 2-layer random model: every part is
reported and the tier's cache figures hold. Timings are never asserted."""

import json

import bench
from bench import offload as bench_offload

MICRO = bench_offload.Sizes(4, 2, 40, 8, 3, pool_conversations=1, concurrency=2,
                            restore_blocks=3, repeats=1)


def test_offload_reports_every_part(tiny_model, tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(bench_offload, "QUICK", MICRO)
    out = tmp_path / "offload.json"
    result = bench.main(["offload", "--quick", "--model", str(tiny_model), "--dtype", "float32",
                         "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    figures = result["chats"]["figures"]
    assert set(figures) == {"unbounded_pool", "tier_off", "tier_on"}
    assert figures["unbounded_pool"]["evictions"] == 0
    assert figures["tier_off"]["evictions"] > 0
    # The tier serves what the small pool evicted: the unbounded pool's cached share.
    assert figures["tier_on"]["prefix_cache_hits_tier"] > 0
    on, off = figures["tier_on"], figures["tier_off"]
    unbounded = figures["unbounded_pool"]["cached_share_turns_2_plus"]
    assert on["cached_share_turns_2_plus"] >= unbounded - 0.02
    assert off["cached_share_turns_2_plus"] < on["cached_share_turns_2_plus"]
    restart = result["restart"]
    assert restart["restarted"]["cached_share_mean"] > restart["cold"]["cached_share_mean"]
    assert set(result["restore"]["per_block_s"]) == {"memory", "disk", "recompute"}
    assert set(result["targets"]) and all("met" in t for t in result["targets"].values())
