"""Smoke test of the benchmark: every section runs and reports its keys.

It runs on the 2-layer random model of conftest.py (SmolLM2's tokenizer and chat
template), so it takes seconds. Timings are never asserted: they are noise here.
"""

import json

import bench
from bench import engine as bench_engine
from bench.workloads import Sizes

# The smallest workload that still walks every code path: two decode batch sizes,
# and a chat whose turn 2 can hit turn 1's full blocks.
MICRO = Sizes(
    prefill_prompts=2,
    prefill_len=16,
    decode_prompt_len=8,
    decode_new_tokens=2,
    decode_concurrency=(1, 2),
    conversation_tokens=64,
    reply_tokens=2,
    warmup_len=4,
    warmup_new_tokens=2,
)


def test_bench_reports_every_figure(tiny_model, tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(bench_engine, "FULL", MICRO)
    out = tmp_path / "engine.json"
    result = bench.main(
        ["--model", str(tiny_model), "--dtype", "float32", "--out", str(out), "--rounds", "3"]
    )

    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    env = result["environment"]
    assert env["dtype"] == "float32" and env["model"] == str(tiny_model)
    for side in ("ours", "transformers"):
        assert result[side]["prefill"]["tokens"] == 2 * 16
        assert result[side]["prefill"]["tokens_per_s"] > 0
        for c in ("1", "2"):
            fig = result[side]["decode"][c]
            assert fig["decode_tokens_per_s"] > 0 and fig["e2e_output_tokens_per_s"] > 0
    assert result["ours"]["prefill"]["cached_tokens"] == 0
    assert result["ours"]["preemptions"] == 0
    assert 0 <= result["ours"]["decode"]["2"]["greedy_match_vs_transformers"] <= 1
    turns = result["two_turn"]
    assert turns["cache_off"]["cached_tokens"] == 0
    assert turns["cache_on"]["cached_tokens"] >= 16  # turn 1's full blocks
    assert turns["turn2_prompt_tokens"] > turns["turn1_prompt_tokens"] + turns["reply_tokens"]
    assert {
        "prefill_ours_over_transformers",
        "decode_1_ours_over_transformers",
        "decode_2_ours_over_transformers",
        "decode_2_e2e_ours_over_transformers",
        "two_turn_ttft_cache_on_over_off",
    } <= set(result["ratios"])
    # Each throughput ratio is the median of three paired rounds, and the figures
    # shown are that round's.
    assert len(result["rounds"]) == 3
    for key in ("prefill_ours_over_transformers", "decode_2_ours_over_transformers"):
        per_round = sorted(run["ratios"][key] for run in result["rounds"])
        assert result["ratios"][key] == per_round[1]
    middle = [
        run
        for run in result["rounds"]
        if run["ratios"]["decode_1_ours_over_transformers"]
        == result["ratios"]["decode_1_ours_over_transformers"]
    ]
    assert result["ours"]["decode"]["1"] == middle[0]["ours"]["decode"]["1"]
