"""The engine's allocator setting on glibc, and the KV pool mapped as written."""

import asyncio
import platform
import time
from pathlib import Path

import pytest
import torch

from inference import async_engine, model_runner
from inference.async_engine import AsyncEngine
from inference.config import EngineConfig
from inference.cpu_allocator import (
    available_memory_bytes,
    keep_heap_pages,
    zeros_mapped_on_write,
)
from inference.llm_engine import LLMEngine
from inference.memory_plan import ModelDoesNotFitError
from inference.sampling_params import SamplingParams

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
linux_only = pytest.mark.skipif(not Path("/proc/self/smaps").exists(),
                                reason="reads resident pages from /proc/self/smaps")
MiB = 1 << 20


def resident_bytes(t: torch.Tensor) -> int:
    """Resident bytes of the mapping that holds t's first byte, from /proc/self/smaps."""
    ptr, inside = t.data_ptr(), False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= ptr < end
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no mapping holds the tensor")


@glibc_only
def test_glibc_accepts_the_heap_padding():
    assert keep_heap_pages() is True


def test_a_cpu_engine_keeps_freed_heap_mapped(tiny_model, monkeypatch):
    calls = []
    monkeypatch.setattr(model_runner, "keep_heap_pages", lambda: calls.append(1) or True)
    LLMEngine(EngineConfig(model=str(tiny_model), dtype="float32", num_blocks=8))
    assert calls == [1]


@linux_only
def test_a_tensor_mapped_on_write_reads_zeros_and_is_resident_where_written():
    t = zeros_mapped_on_write((64, 1024, 256), torch.float32)  # 64 MiB
    assert t.shape == (64, 1024, 256) and t.dtype == torch.float32
    assert resident_bytes(t) < 4 * MiB  # nothing written yet
    t[3].fill_(1.5)  # 1 MiB
    assert 1 * MiB <= resident_bytes(t) < 5 * MiB
    assert t.sum().item() == 1.5 * 1024 * 256  # reading the rest reads zeros
    assert zeros_mapped_on_write((0, 4), torch.bfloat16).shape == (0, 4)


@linux_only
def test_a_cpu_engine_pool_is_resident_as_its_blocks_are_written(tiny_model):
    engine = LLMEngine(EngineConfig(model=str(tiny_model), dtype="float32",
                                    kv_cache_memory_bytes=64 * MiB))
    pool = engine.runner.kv_cache
    assert pool.nbytes > 60 * MiB and resident_bytes(pool) < 4 * MiB
    engine.generate([list(range(1, 200))], SamplingParams(max_tokens=4, temperature=0))
    per_block = pool.nbytes // pool.shape[2]
    # 13 blocks written (K and V of every layer), each page-sized piece mapped once.
    assert 13 * per_block <= resident_bytes(pool) < 13 * per_block + 8 * MiB


def test_an_async_engine_hands_freed_heap_back_once_each_time_it_goes_idle(
        tiny_model, monkeypatch):
    calls = []
    monkeypatch.setattr(async_engine, "release_free_heap", lambda: calls.append(1) or True)
    engine = AsyncEngine(engine=LLMEngine(EngineConfig(model=str(tiny_model), dtype="float32",
                                                       num_blocks=64)))

    async def one_request() -> None:
        params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
        outs = [o async for o in engine.generate(list(range(1, 40)), params)]
        assert outs[-1].finished

    def trims_after(wait_s: float) -> int:
        deadline = time.monotonic() + wait_s
        while not calls and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.2)  # two idle passes of the step thread: neither trims again
        return len(calls)

    try:
        time.sleep(0.6)  # an idle pass of the step thread before any request
        assert calls == []  # idle from the start: nothing stepped, nothing to hand back
        asyncio.run(one_request())
        assert trims_after(10) == 1
        calls.clear()
        asyncio.run(one_request())
        assert trims_after(10) == 1
    finally:
        engine.shutdown()


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  2048000 kB\nMemFree:  100 kB\nMemAvailable:  1024 kB\n")
    assert available_memory_bytes(str(meminfo)) == 1024 * 1024
    assert available_memory_bytes(str(tmp_path / "missing")) is None


def test_a_pool_larger_than_the_available_memory_is_cut_or_refused_at_start(
        tiny_model, monkeypatch, caplog):
    """Mapped as written, a pool too large for the host would start fine and fail once
    its blocks fill: it is cut to what the host has (tests/inference/test_memory_plan.py),
    and a start left too little for one is refused with the numbers."""
    def engine() -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(tiny_model), dtype="float32", num_blocks=64))

    monkeypatch.setattr(model_runner, "available_memory_bytes", lambda: 1 << 40)
    with caplog.at_level("WARNING", logger="inference.memory_plan"):
        assert engine().runner.num_blocks == 64
    assert "is cut" not in caplog.text
    monkeypatch.setattr(model_runner, "available_memory_bytes", lambda: 4096)
    with pytest.raises(ModelDoesNotFitError, match="tokens of KV cache"):
        engine()
