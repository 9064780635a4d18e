"""A start is planned against the host's memory: weights that cannot fit are refused
with the numbers before any is read, the KV pool is cut to what is left, and an
optional copy is left out where it would crowd the pool out."""

from __future__ import annotations

import pytest

from bench.random_gguf import TINY, write
from inference import memory_plan, model_runner
from inference.config import EngineConfig
from inference.llm_engine import LLMEngine
from inference.memory_plan import HEADROOM_BYTES, MIN_POOL_TOKENS, ModelDoesNotFitError

GIB = 2**30


def test_weights_larger_than_the_host_are_refused_with_the_numbers():
    with pytest.raises(ModelDoesNotFitError, match=r"8\.0 GiB.*4\.0 GiB available"):
        memory_plan.check_weights_fit("big.gguf", 8 * GIB, 4 * GIB)
    memory_plan.check_weights_fit("big.gguf", 3 * GIB, 4 * GIB)
    memory_plan.check_weights_fit("big.gguf", 8 * GIB, None)  # the host does not say


def test_the_pool_is_cut_to_what_is_left():
    per_block = 1 << 20
    assert memory_plan.pool_blocks(100, per_block, 16, None) == 100
    assert memory_plan.pool_blocks(100, per_block, 16, GIB) == 100
    left = HEADROOM_BYTES + 40 * per_block
    assert memory_plan.pool_blocks(100, per_block, 16, left) == 40
    with pytest.raises(ModelDoesNotFitError, match="tokens of KV cache"):
        memory_plan.pool_blocks(100, per_block, 16,
                                HEADROOM_BYTES + (MIN_POOL_TOKENS // 16 - 1) * per_block)


def test_copies_fit_beside_the_pool():
    assert memory_plan.copies_fit(GIB, GIB, 3 * GIB)
    assert not memory_plan.copies_fit(2 * GIB, GIB, 3 * GIB)
    assert memory_plan.copies_fit(100 * GIB, GIB, None)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("gguf") / "small.gguf", TINY["llama"], "Q8_0")


def start(path, cache, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), model_cache_dir=str(cache), dtype="float32",
                                  **kw))


def test_an_engine_refuses_a_file_the_host_cannot_hold(small_file, tmp_path, monkeypatch):
    monkeypatch.setattr(model_runner, "available_memory_bytes", lambda: 64 << 20)
    with pytest.raises(ModelDoesNotFitError, match="small.gguf needs"):
        start(small_file, tmp_path)


def test_an_engine_cuts_its_pool_to_the_memory_left(small_file, tmp_path, monkeypatch):
    full = start(small_file, tmp_path, kv_cache_memory_bytes=256 << 20)
    per_block = full.runner.kv_cache.nbytes // full.runner.num_blocks
    # Room for the file's weights too (checked first, against the same reading).
    blocks = max(100, small_file.stat().st_size // per_block + 1)
    monkeypatch.setattr(model_runner, "available_memory_bytes",
                        lambda: HEADROOM_BYTES + blocks * per_block)
    cut = start(small_file, tmp_path, kv_cache_memory_bytes=256 << 20)
    assert cut.runner.num_blocks == blocks < full.runner.num_blocks
    assert cut.max_model_len <= blocks * 16
