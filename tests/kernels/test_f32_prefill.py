"""The fp32 prefill kernels (csrc/f32/gemm.c, attention.c): the GEMM of many rows
against a stored weight and the causal attention of a prompt over the paged cache,
held to torch's fp32 reference, their rows independent of the rows beside them, and
the choice between them and torch's kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import attention, c_build, f32_kernels, kv_quant
from kernels import quant_linear as ql
from kernels.attention import AttentionMetadata, gather_kv, widened

pytestmark = pytest.mark.skipif(c_build.compiler() is None, reason="needs a C compiler")


def weight(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g) / inp**0.5


@pytest.mark.parametrize("kind", ql.KINDS)
@pytest.mark.parametrize(("rows", "out", "inp"), [(512, 960, 576), (13, 37, 100), (700, 48, 1536)])
def test_the_gemm_multiplies_as_f_linear_over_the_dequantized_weight(kind, rows, out, inp):
    qw = ql.quantize(weight(out, inp, seed=rows), kind)
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(1))
    got = f32_kernels.gemm(x, kind, qw.data, qw.scale, inp)
    dq = ql.dequantize(qw).double()
    bound = 1e-5 * (x.abs().double() @ dq.abs().T) + 1e-6
    assert ((got.double() - x.double() @ dq.T).abs() <= bound).all()


def test_a_gemm_row_is_the_same_alone_as_among_others():
    """A prompt's row does not depend on the rows beside it, bit for bit: a chunked
    prefill or a prefix-cache hit gets the rows a whole prompt would."""
    qw = ql.quantize(weight(200, 576, seed=5), "int4")
    x = torch.randn(530, 576)
    whole = f32_kernels.gemm(x, "int4", qw.data, qw.scale, 576)
    for lo, hi in [(0, 1), (7, 13), (100, 356), (529, 530)]:
        assert torch.equal(f32_kernels.gemm(x[lo:hi].contiguous(), "int4", qw.data, qw.scale,
                                            576), whole[lo:hi])


def test_the_gemm_refuses_what_it_cannot_take():
    qw = ql.quantize(weight(16, 64), "int8")
    with pytest.raises(ValueError):
        f32_kernels.gemm(torch.randn(4, 63), "int8", qw.data, qw.scale, 64)
    with pytest.raises(ValueError):
        f32_kernels.gemm(torch.randn(4, 64).bfloat16(), "int8", qw.data, qw.scale, 64)
    with pytest.raises(ValueError):
        f32_kernels.gemm(torch.randn(0, 64), "int8", qw.data, qw.scale, 64)


def caches(length: int, kv_heads: int, head_dim: int, dtype: torch.dtype, block_size: int = 16,
           seed: int = 0):
    """K/V caches of `dtype` holding `length` random tokens, its blocks out of order."""
    g = torch.Generator().manual_seed(seed)
    blocks = -(-length // block_size) + 2
    row = kv_quant.pool_last_axis(head_dim, dtype)
    k_cache = torch.zeros(blocks, block_size, kv_heads, row, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    table = torch.randperm(blocks, generator=g)[: -(-length // block_size)]
    slots = (table[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:length]
    k = torch.randn(length, kv_heads, head_dim, generator=g)
    v = torch.randn(length, kv_heads, head_dim, generator=g)
    f32_kernels.store_kv(k, v, k_cache, v_cache, slots.contiguous())
    return k_cache, v_cache, table


def reference(q, k_cache, v_cache, table, length, scale):
    """Causal attention in fp64 over the values the caches hold."""
    n, heads, _ = q.shape
    k = widened(gather_kv(k_cache, table, length), torch.float32).double()
    v = widened(gather_kv(v_cache, table, length), torch.float32).double()
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, 1).transpose(0, 1), v.repeat_interleave(group, 1).transpose(0, 1)
    s = q.double().transpose(0, 1) @ k.transpose(1, 2) * scale
    future = torch.arange(length)[None] > torch.arange(length - n, length)[:, None]
    return (s.masked_fill(future, float("-inf")).softmax(-1) @ v).transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, kv_quant.POOL_DTYPE])
@pytest.mark.parametrize(("n", "length", "heads", "kv_heads", "head_dim"),
                         [(512, 512, 9, 3, 64), (37, 300, 4, 2, 64), (130, 130, 8, 1, 128),
                          (1, 1, 2, 2, 16), (20, 150, 8, 2, 256)])
def test_prefill_attention_matches_the_reference(dtype, n, length, heads, kv_heads, head_dim):
    k_cache, v_cache, table = caches(length, kv_heads, head_dim, dtype, seed=n)
    q = torch.randn(n, heads, head_dim, generator=torch.Generator().manual_seed(2))
    got = f32_kernels.prefill_attention(q, k_cache, v_cache, table, length, head_dim**-0.5)
    want = reference(q, k_cache, v_cache, table, length, head_dim**-0.5)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, kv_quant.POOL_DTYPE])
def test_a_prompts_rows_attend_the_same_whole_chunked_or_after_a_cache_hit(dtype):
    """Each query row's result, bit for bit, whatever block of queries it came in: so
    the prefix cache and chunked prefill change nothing in what a position computes."""
    length, heads = 600, 9
    k_cache, v_cache, table = caches(length, 3, 64, dtype, seed=7)
    q = torch.randn(length, heads, 64)
    whole = f32_kernels.prefill_attention(q, k_cache, v_cache, table, length, 0.125)
    for lo, hi in [(0, 256), (256, 512), (512, 600), (100, 101), (333, 600)]:
        part = f32_kernels.prefill_attention(q[lo:hi], k_cache, v_cache, table, hi, 0.125)
        assert torch.equal(part, whole[lo:hi])


def test_prefill_attention_takes_query_rows_inside_a_fused_projection():
    """The queries of a fused qkv projection: a view whose token rows are wider."""
    k_cache, v_cache, table = caches(40, 2, 32, torch.float32)
    qkv = torch.randn(40, 4 * 32 + 2 * 2 * 32)
    q = qkv[:, : 4 * 32].view(40, 4, 32)
    assert f32_kernels.runs_prefill_attention(q, k_cache)
    got = f32_kernels.prefill_attention(q, k_cache, v_cache, table, 40, 0.2)
    assert torch.equal(got, f32_kernels.prefill_attention(q.contiguous(), k_cache, v_cache,
                                                          table, 40, 0.2))


def test_prefill_attention_refuses_what_it_cannot_read():
    k_cache, v_cache, table = caches(40, 2, 32, torch.float32)
    q = torch.randn(5, 4, 32)
    with pytest.raises(ValueError, match="past the end"):  # a block outside the pool
        f32_kernels.prefill_attention(q, k_cache, v_cache, torch.full_like(table, 99), 40, 1.0)
    with pytest.raises(ValueError):  # more queries than positions
        f32_kernels.prefill_attention(q, k_cache, v_cache, table, 4, 1.0)
    with pytest.raises(ValueError):  # a table too short for the length
        f32_kernels.prefill_attention(q, k_cache, v_cache, table[:1], 40, 1.0)
    odd = torch.zeros(4, 16, 2, 24)  # head_dim not a multiple of 16
    assert not f32_kernels.runs_prefill_attention(torch.randn(5, 4, 24), odd)
    assert not f32_kernels.runs_prefill_attention(q.bfloat16(), k_cache)


def metadata(query_lens: list[int], seq_lens: list[int], tables: torch.Tensor) -> AttentionMetadata:
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    slots = torch.cat([
        (tables[i][(torch.arange(length - n, length) // 16)] * 16
         + torch.arange(length - n, length) % 16)
        for i, (n, length) in enumerate(zip(query_lens, seq_lens, strict=True))])
    return AttentionMetadata(slot_mapping=slots, block_tables=tables, query_start_loc=starts,
                             seq_lens=seq_lens)


def test_an_fp32_prompt_attends_through_the_own_kernel_where_it_is_fast():
    """paged_attention sends an fp32 prompt on the CPU to the C kernel where its tile is
    measured fast (AVX2 builds), torch's kernels elsewhere: the same attention either
    way, within fp32's rounding."""
    k_cache, v_cache, table = caches(300, 3, 64, kv_quant.POOL_DTYPE, seed=3)
    q = torch.randn(300 + 40, 9, 64)
    tables = torch.stack([table, table])
    meta = metadata([300, 40], [300, 300], tables)
    got = attention.paged_attention(q, k_cache, v_cache, meta, 0.125)
    c = [f32_kernels.prefill_attention(q[:300], k_cache, v_cache, table, 300, 0.125),
         f32_kernels.prefill_attention(q[300:], k_cache, v_cache, table, 300, 0.125)]
    if f32_kernels.tiles_fast():
        assert torch.equal(got, torch.cat(c))
    torch.testing.assert_close(got, torch.cat(c), rtol=1e-5, atol=2e-6)


@pytest.fixture
def fresh_choice(monkeypatch):
    ql.prefill_gemm.cache_clear()
    yield monkeypatch
    ql.prefill_gemm.cache_clear()


@pytest.mark.parametrize(("vendor", "env", "want"), [
    ("AuthenticAMD", None, "own"), ("GenuineIntel", None, "torch"), ("", None, "torch"),
    ("GenuineIntel", "own", "own"), ("AuthenticAMD", "torch", "torch"),
    ("AuthenticAMD", "fastest", "own")])
def test_the_prefill_gemm_is_chosen_by_vendor_or_setting(fresh_choice, vendor, env, want):
    fresh_choice.setattr(ql, "cpu_vendor", lambda: vendor)
    fresh_choice.setattr(f32_kernels, "tiles_fast", lambda: True)
    if env is None:
        fresh_choice.delenv(ql.PREFILL_GEMM_ENV, raising=False)
    else:
        fresh_choice.setenv(ql.PREFILL_GEMM_ENV, env)
    assert ql.prefill_gemm() == want
    ql.prefill_gemm.cache_clear()
    fresh_choice.setattr(f32_kernels, "tiles_fast", lambda: False)
    assert ql.prefill_gemm() == "torch"  # where the tile is not fast, torch's GEMM


@pytest.mark.parametrize("choice", ["own", "torch"])
def test_many_fp32_rows_multiply_the_same_with_either_gemm(monkeypatch, choice):
    monkeypatch.setattr(ql, "prefill_gemm", lambda: choice)
    qw = ql.quantize(weight(300, 576, seed=9), "int4")
    x = torch.randn(2, 70, 576)
    bias = torch.randn(300)
    got = ql.quant_linear(x, qw, bias)
    assert got.shape == (2, 70, 300)
    torch.testing.assert_close(got, F.linear(x, ql.dequantize(qw), bias), rtol=1e-5, atol=1e-5)
    assert ql.quant_linear(torch.randn(0, 576), qw).shape == (0, 300)  # an empty batch
