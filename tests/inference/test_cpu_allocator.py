"""The engine's allocator setting on glibc."""

import platform

import pytest

from inference import model_runner
from inference.config import EngineConfig
from inference.cpu_allocator import keep_heap_pages
from inference.llm_engine import LLMEngine

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)


@glibc_only
def test_glibc_accepts_the_heap_padding():
    assert keep_heap_pages() is True


def test_a_cpu_engine_keeps_freed_heap_mapped(tiny_model, monkeypatch):
    calls = []
    monkeypatch.setattr(model_runner, "keep_heap_pages", lambda: calls.append(1) or True)
    LLMEngine(EngineConfig(model=str(tiny_model), dtype="float32", num_blocks=8))
    assert calls == [1]
