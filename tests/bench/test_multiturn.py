"""Smoke test of `python -m bench multiturn` on the 2-layer random model: every
system and figure is reported, and the cache figures obey their ceilings. Timings are
never asserted."""

import json

import bench
from bench import multiturn as bench_multiturn

MICRO = bench_multiturn.ChatSizes(
    conversations=2,
    turns=2,
    system_tokens=40,
    user_tokens=8,
    reply_tokens=3,
    hf_conversations=1,
    random_requests=2,
    overhead_repeats=1,
    hit_samples=1,
)


def test_multiturn_reports_every_system(tiny_model, tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(bench_multiturn, "QUICK", MICRO)
    out, png = tmp_path / "multiturn.json", tmp_path / "multiturn.png"
    result = bench.main(
        [
            "multiturn",
            "--quick",
            "--model",
            str(tiny_model),
            "--dtype",
            "float32",
            "--out",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    if png.exists():  # matplotlib is a dev dependency
        assert png.read_bytes()[:4] == b"\x89PNG"

    systems = result["systems"]
    assert set(systems) == {"cache_on", "cache_off", "transformers"}
    assert systems["cache_on"]["summary"]["completed"] == 4
    assert systems["cache_off"]["summary"]["completed"] == 4
    assert systems["transformers"]["summary"]["completed"] == 2  # one conversation
    for name, s in systems.items():
        for r in s["requests"]:
            assert r["completion_tokens"] == 3, name  # exactly R tokens: EOS is ignored
            assert 0 <= r["cached_tokens"] <= r["max_cached_tokens"] < r["prompt_tokens"]
        assert [t["turn"] for t in s["by_turn"]] == [1, 2]
        assert s["turns_2_plus"]["ttft_s"]["count"] > 0
    # The same prompts everywhere.
    prompt_sizes = {
        name: {(r["conversation"], r["turn"]): r["prompt_tokens"] for r in s["requests"]}
        for name, s in systems.items()
    }
    assert prompt_sizes["cache_on"] == prompt_sizes["cache_off"]
    assert prompt_sizes["transformers"].items() <= prompt_sizes["cache_on"].items()

    on = systems["cache_on"]
    assert on["summary"]["cached_tokens"] > 0
    assert systems["cache_off"]["summary"]["cached_tokens"] == 0
    # Turn 2 reuses its whole history: the ceiling is reached exactly.
    for r in on["requests"]:
        if r["turn"] == 2:
            assert r["cached_tokens"] == r["max_cached_tokens"] > 0

    hit = result["hit_vs_fresh"]["pairs"][0]
    assert hit["cached_tokens"] > 0 and hit["suffix_cached_tokens"] == 0
    assert hit["suffix_tokens"] == hit["prompt_tokens"] - hit["cached_tokens"]
    assert hit["uncached_ttft_s"] > 0 and result["hit_vs_fresh"]["hit_over_uncached_p50"] > 0
    overhead = result["zero_hit_overhead"]
    assert all(run["cached_tokens"] == 0 for runs in overhead["runs"].values() for run in runs)
    assert overhead["on_over_off"] == overhead["paired_on_over_off"][0] > 0

    ratios = result["ratios"]
    assert ratios["ttft_turns_2_plus_cache_on_over_off"] > 0
    assert 0 < ratios["cached_share_of_theoretical_max"] <= 1
    assert len(ratios["targets"]) == 4


def test_zero_hit_engines_take_steps_in_turn(make_engine, monkeypatch):
    """Cache on and off serve the same prompts in one loop, stepping A B, B A, ...,
    and each is timed inside its own calls only."""
    engines = {"on": make_engine(), "off": make_engine(enable_prefix_caching=False)}
    order = []
    for name, engine in engines.items():
        real = engine.step
        monkeypatch.setattr(
            engine, "step", lambda name=name, real=real: order.append(name) or real()
        )
    prompts = [[5, 6, 7, 8] * 10, [9, 10, 11] * 9, [5, 6, 7, 8] * 10]
    runs = bench_multiturn.interleaved_runs(engines, prompts, reply_tokens=4)
    pairs = [order[i : i + 2] for i in range(0, len(order), 2)]
    assert pairs[:4] == [["on", "off"], ["off", "on"], ["on", "off"], ["off", "on"]]
    for run in runs.values():
        assert run["completed"] == 3 and run["failed"] == 0
        assert run["busy_s"] > 0 and run["output_throughput"] > 0
    assert runs["off"]["cached_tokens"] == 0
