"""Qwen3 (per-head q/k norms, its own head_dim) and Llama 3.2 (llama3 RoPE scaling,
prompts past the original context): the prefix cache changes nothing. Greedy output is
the same with the cache on and off and equals transformers'; preempted requests and
salted tenants keep it."""

from __future__ import annotations

import pytest
import torch

from inference import EngineConfig, LLMEngine, SamplingParams
from tests.inference.conftest import make_tiny_model

LLAMA32_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
FAMILIES = {
    "qwen3": ("qwen3", {"head_dim": 32}),
    "llama3.2": ("llama", {"rope_parameters": LLAMA32_ROPE}),
}
PARAMS = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)


def rand_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    model_type, extra = FAMILIES[request.param]
    return make_tiny_model(tmp_path_factory.mktemp(request.param), model_type, seed=3,
                           norm_std=0.1, **extra)


def engine(path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", **kw))


def test_greedy_output_is_the_same_with_the_cache_on_and_off_and_equals_transformers(family):
    from transformers import AutoModelForCausalLM

    prompts = [rand_ids(50 + 13 * i, 300 + i) for i in range(4)]  # past 64 positions
    cached = engine(family, num_blocks=128)
    first = [o[0].token_ids for o in cached.generate(prompts, PARAMS)]
    second = cached.generate(prompts, PARAMS)
    assert all(o[0].cached_tokens >= 48 for o in second)
    assert [o[0].token_ids for o in second] == first
    plain = engine(family, num_blocks=128, enable_prefix_caching=False)
    assert [o[0].token_ids for o in plain.generate(prompts, PARAMS)] == first
    hf = AutoModelForCausalLM.from_pretrained(family, dtype=torch.float32).eval()
    for ids, ours in zip(prompts, first, strict=True):
        with torch.no_grad():
            g = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        assert g[0, len(ids):].tolist() == ours


def test_preempted_requests_and_salted_tenants_keep_their_greedy_output(family):
    prompts = [rand_ids(40 + 7 * i, 100 + i) for i in range(6)]
    roomy = engine(family, num_blocks=256)
    expected = [o[0].token_ids for o in roomy.generate(prompts, PARAMS)]
    tight = engine(family, num_blocks=16, max_num_batched_tokens=64)
    assert [o[0].token_ids for o in tight.generate(prompts, PARAMS)] == expected
    assert tight.metrics_snapshot()["preemptions"] > 0

    [[a]] = roomy.generate([prompts[5]], PARAMS, cache_salt="tenant-a")
    [[b]] = roomy.generate([prompts[5]], PARAMS, cache_salt="tenant-b")
    [[c]] = roomy.generate([prompts[5]], PARAMS, cache_salt="tenant-a")
    assert (a.cached_tokens, b.cached_tokens, c.cached_tokens) == (0, 0, 64)
    assert a.token_ids == b.token_ids == c.token_ids == expected[5]
