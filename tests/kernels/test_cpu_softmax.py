"""The compiled causal softmax (kernels/cpu_softmax) against torch's, its build cache,
and its fallback where it can't run."""

import logging
import subprocess

import pytest
import torch

import kernels.attention as attention
from kernels import cpu_softmax
from kernels.attention import AttentionMetadata, paged_attention

needs_kernel = pytest.mark.skipif(
    not cpu_softmax.available(), reason="needs AVX512-BF16 and a C compiler"
)


def torch_causal_softmax(scores: torch.Tensor, n: int) -> torch.Tensor:
    length = scores.shape[-1]
    q = torch.arange(scores.shape[-2]) % n
    future = torch.arange(length)[None, :] > (length - n + q)[:, None]
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "heads,group,n,length",
    [(3, 3, 82, 1490), (1, 1, 1, 1), (2, 1, 1, 40), (1, 4, 17, 17), (3, 2, 5, 33), (1, 1, 7, 3000)],
)
def test_matches_torch_within_one_bf16_step(heads, group, n, length, threads):
    torch.manual_seed(length + n)
    scores = (torch.randn(heads, group * n, length) * 6).bfloat16()
    ref = torch_causal_softmax(scores, n)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_softmax.causal_softmax_(scores.clone(), n)
    finally:
        torch.set_num_threads(before)
    # One bf16 step apart at most: compare the bit patterns of these non-negative values.
    steps = (got.view(torch.int16).int() - ref.view(torch.int16).int()).abs()
    assert steps.max().item() <= 1
    assert (got.float().sum(-1) - 1).abs().max().item() < 0.02


@needs_kernel
def test_keys_past_each_query_get_exactly_zero_and_the_scores_change_in_place():
    n, length = 4, 10
    scores = torch.zeros(2 * n, length, dtype=torch.bfloat16)
    out = cpu_softmax.causal_softmax_(scores, n)
    assert out.data_ptr() == scores.data_ptr()
    for r in range(2 * n):
        visible = length - n + r % n + 1
        assert torch.all(out[r, visible:] == 0)
        assert torch.allclose(
            out[r, :visible].float(), torch.full((visible,), 1 / visible), rtol=1e-2
        )


@needs_kernel
def test_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="bf16"):
        cpu_softmax.causal_softmax_(torch.zeros(4, 8), 2)
    with pytest.raises(ValueError, match="bf16"):
        cpu_softmax.causal_softmax_(torch.zeros(8, 4, dtype=torch.bfloat16).t(), 2)
    with pytest.raises(ValueError, match="groups"):
        cpu_softmax.causal_softmax_(torch.zeros(5, 8, dtype=torch.bfloat16), 2)
    with pytest.raises(ValueError, match="last"):
        cpu_softmax.causal_softmax_(torch.zeros(5, 4, dtype=torch.bfloat16), 5)


@needs_kernel
def test_bf16_held_whole_attention_uses_the_compiled_softmax(monkeypatch):
    monkeypatch.setattr(attention, "_HELD_WHOLE_DTYPES", {torch.bfloat16})
    calls = []
    real = cpu_softmax.causal_softmax_
    monkeypatch.setattr(
        cpu_softmax, "causal_softmax_", lambda s, n: calls.append((tuple(s.shape), n)) or real(s, n)
    )
    torch.manual_seed(0)
    n, length, heads, kv_heads, dim, bs = 5, 37, 6, 2, 16, 4
    k_cache = torch.randn(16, bs, kv_heads, dim).bfloat16()
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(16)[: -(-length // bs)]
    meta = AttentionMetadata(torch.zeros(n, dtype=torch.long), table[None], [0, n], [length])
    q = torch.randn(n, heads, dim).bfloat16()
    paged_attention(q, k_cache, v_cache, meta, dim**-0.5)
    assert calls == [((kv_heads, heads // kv_heads * n, length), n)]


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """A cold library lookup with its own cache dir, restored afterwards."""
    monkeypatch.setenv("PREFIXCHAT_KERNEL_CACHE", str(tmp_path))
    cpu_softmax._library.cache_clear()
    yield tmp_path
    cpu_softmax._library.cache_clear()


@needs_kernel
def test_the_library_is_built_once_per_source_and_reused(fresh_library, monkeypatch):
    first = cpu_softmax.build(cpu_softmax.compiler(), fresh_library)
    assert first.exists() and list(fresh_library.iterdir()) == [first]

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert cpu_softmax.build(cpu_softmax.compiler(), fresh_library) == first
    assert cpu_softmax.available()


def test_without_the_cpu_flags_nothing_is_compiled(fresh_library, monkeypatch):
    monkeypatch.setattr(cpu_softmax, "cpu_flags", lambda: frozenset({"avx2"}))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("compiled"))
    assert not cpu_softmax.available()
    with pytest.raises(RuntimeError, match="not available"):
        cpu_softmax.causal_softmax_(torch.zeros(2, 2, dtype=torch.bfloat16), 1)


def test_a_failed_compile_falls_back_to_torch_with_a_warning(fresh_library, monkeypatch, caplog):
    monkeypatch.setattr(cpu_softmax, "cpu_flags", lambda: cpu_softmax.NEEDED_FLAGS)
    monkeypatch.setenv("CC", "false")
    with caplog.at_level(logging.WARNING, logger="kernels.cpu_softmax"):
        assert not cpu_softmax.available()
    assert "keeping torch's softmax" in caplog.text
    assert list(fresh_library.iterdir()) == []  # no half-built library left behind
    # Attention still runs, on torch's softmax.
    monkeypatch.setattr(attention, "_HELD_WHOLE_DTYPES", {torch.bfloat16})
    q, k = torch.randn(3, 2, 8).bfloat16(), torch.randn(9, 2, 8).bfloat16()
    mask = AttentionMetadata(torch.zeros(3), torch.zeros(1, 1), [0, 3], [9]).chunk_mask(
        3, 1, torch.bfloat16
    )
    assert attention._attend_held_whole(q, k, k, mask, 8**-0.5).shape == (3, 2, 8)


def test_no_compiler_means_no_kernel(fresh_library, monkeypatch, caplog):
    monkeypatch.setattr(cpu_softmax, "cpu_flags", lambda: cpu_softmax.NEEDED_FLAGS)
    monkeypatch.setattr(cpu_softmax, "compiler", lambda: None)
    with caplog.at_level(logging.WARNING, logger="kernels.cpu_softmax"):
        assert not cpu_softmax.available()
    assert "no C compiler" in caplog.text
