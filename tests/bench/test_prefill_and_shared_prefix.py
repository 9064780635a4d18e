"""Smoke tests of `python -m bench prefill-batch` and `python -m bench shared-prefix`
on the 2-layer random model: every figure is reported, and the token counts behind
them hold. Timings are never asserted."""

import json

import bench


def test_prefill_batch_reports_every_way(tiny_model, tmp_path, one_thread):
    out = tmp_path / "prefill_batch.json"
    result = bench.main([
        "prefill-batch", "--model", str(tiny_model), "--dtype", "float32",
        "--prompts", "4", "--tokens", "16", "--rounds", "1", "--out", str(out),
    ])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert set(result["median_seconds"]) == {
        "batched_s", "per_sequence_s", "transformers_s",
        "attention_batched_s", "attention_per_sequence_s",
    }
    assert all(v > 0 for v in result["median_seconds"].values())
    # The per-sequence switch was restored.
    import kernels.attention as attention
    from bench.prefill_batch import _BATCHED_MAX_QUERY

    assert attention._BATCH_MAX_QUERY == _BATCHED_MAX_QUERY > 0


def test_shared_prefix_computes_the_system_prompt_once(tiny_model, tmp_path, one_thread):
    out = tmp_path / "shared_prefix.json"
    result = bench.main([
        "shared-prefix", "--model", str(tiny_model), "--dtype", "float32",
        "--num-conversations", "4", "--system-tokens", "64", "--user-tokens", "8",
        "--reply-tokens", "2", "--rounds", "1", "--step-budget", "4096", "--out", str(out),
    ])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    med = result["median"]
    computed = {name: m["prompt_tokens_computed"] for name, m in med.items()}
    # Without in-flight sharing all four prompts are computed whole in one step.
    assert computed["fresh_no_wait"] == sum(result["prompt_tokens"])
    # With it, the system prompt's blocks once: what the warm engine computes, plus
    # those blocks (which the warm engine's earlier request computed).
    shared = computed["fresh"] - computed["warm"]
    assert 0 < shared < computed["fresh_no_wait"] - computed["warm"]
    assert shared % 16 == 0
    assert all(m["ttft_p50_s"] > 0 for m in med.values())
