"""The compiled CPU kernels (kernels/cpu_kernels) against torch: the causal softmax,
the head-major gather, paged decode attention and RMSNorm; their build cache, and
the fallback where they can't run."""

import logging
import subprocess

import pytest
import torch

import kernels.attention as attention
from kernels import cpu_kernels, cpu_linear
from kernels.attention import AttentionMetadata, gather_kv, paged_attention
from tests.kernels.test_attention import dense_attention

needs_kernel = pytest.mark.skipif(
    not cpu_kernels.available(), reason="needs AVX512-BF16 and a C compiler"
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
        got = cpu_kernels.causal_softmax_(scores.clone(), n)
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
    out = cpu_kernels.causal_softmax_(scores, n)
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
        cpu_kernels.causal_softmax_(torch.zeros(4, 8), 2)
    with pytest.raises(ValueError, match="bf16"):
        cpu_kernels.causal_softmax_(torch.zeros(8, 4, dtype=torch.bfloat16).t(), 2)
    with pytest.raises(ValueError, match="groups"):
        cpu_kernels.causal_softmax_(torch.zeros(5, 8, dtype=torch.bfloat16), 2)
    with pytest.raises(ValueError, match="last"):
        cpu_kernels.causal_softmax_(torch.zeros(5, 4, dtype=torch.bfloat16), 5)


def spy(monkeypatch, name: str) -> list[tuple]:
    """Record the arguments of every call of cpu_kernels.<name>, which still runs."""
    calls = []
    real = getattr(cpu_kernels, name)
    monkeypatch.setattr(cpu_kernels, name, lambda *a: calls.append(a) or real(*a))
    return calls


def paged_decode_case(lens, heads, kv_heads, head_dim, block_size=16, seed=0):
    """Caches with each sequence's blocks scattered in random order, and the dense
    K/V each sequence's table points at."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in lens]
    num_blocks = sum(per_seq) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).bfloat16()
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).bfloat16()
    order = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(len(lens), max(per_seq) + 2, dtype=torch.int64)  # padded with 0
    dense, used = [], 0
    for b, (n, nb) in enumerate(zip(lens, per_seq, strict=True)):
        tables[b, :nb] = order[used : used + nb]
        used += nb
        k = k_cache[tables[b, :nb]].flatten(0, 1)[:n]
        v = v_cache[tables[b, :nb]].flatten(0, 1)[:n]
        dense.append((k, v))
    query = torch.randn(len(lens), heads, head_dim, generator=g).bfloat16()
    return query, k_cache, v_cache, tables, torch.tensor(lens), dense


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "lens,heads,kv_heads,head_dim",
    [
        ([30, 1, 17, 64, 33], 9, 3, 64),  # SmolLM2's shape: GQA 3, ragged contexts
        ([5, 200], 4, 4, 64),  # GQA 1
        ([1000], 6, 2, 128),
        ([3, 40], 2, 1, 16),
        ([19], 8, 2, 96),  # a head_dim with no specialised loop
    ],
)
def test_paged_decode_attention_matches_dense(lens, heads, kv_heads, head_dim, threads):
    query, k_cache, v_cache, tables, lens_t, dense = paged_decode_case(
        lens, heads, kv_heads, head_dim
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_kernels.paged_decode_attention(
            query, k_cache, v_cache, tables, lens_t, head_dim**-0.5
        )
    finally:
        torch.set_num_threads(before)
    assert got.shape == query.shape and got.dtype == torch.bfloat16
    for b, (k, v) in enumerate(dense):
        ref = dense_attention(query[b : b + 1].float(), k.float(), v.float(), head_dim**-0.5)
        # fp32 throughout, one rounding to bf16 at the end.
        assert (got[b].float() - ref[0]).abs().max().item() < 1e-2, b


@needs_kernel
def test_paged_decode_attention_reads_only_its_own_blocks():
    """Blocks past a sequence's length (other sequences', or garbage) change nothing."""
    query, k_cache, v_cache, tables, lens, _ = paged_decode_case([20, 7], 9, 3, 64)
    first = cpu_kernels.paged_decode_attention(query, k_cache, v_cache, tables, lens, 0.125)
    k2, v2 = k_cache.clone(), v_cache.clone()
    used = {int(blk) for b, n in enumerate(lens.tolist()) for blk in tables[b, : -(-n // 16)]}
    for blk in set(range(k_cache.shape[0])) - used:
        k2[blk], v2[blk] = 1e4, -1e4
    # Slots past the length inside a sequence's last block.
    k2[tables[0, 1], 20 - 16 :], v2[tables[0, 1], 20 - 16 :] = 1e4, 1e4
    second = cpu_kernels.paged_decode_attention(query, k2, v2, tables, lens, 0.125)
    assert torch.equal(first, second)


@needs_kernel
def test_paged_decode_attention_rejects_what_it_cannot_read():
    query, k_cache, v_cache, tables, lens, _ = paged_decode_case([4], 2, 1, 16)
    with pytest.raises(ValueError, match="bf16"):
        cpu_kernels.paged_decode_attention(query.float(), k_cache, v_cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="int64"):
        cpu_kernels.paged_decode_attention(query, k_cache, v_cache, tables.int(), lens, 1.0)
    with pytest.raises(ValueError, match="one length per query"):
        cpu_kernels.paged_decode_attention(query, k_cache, v_cache, tables, lens[:0], 1.0)
    odd = torch.zeros(2, 16, 1, 8, dtype=torch.bfloat16)
    assert not cpu_kernels.runs_decode(odd)
    with pytest.raises(ValueError, match="multiple of 16"):
        cpu_kernels.paged_decode_attention(
            query[:, :, :8].contiguous(), odd, odd, tables, lens, 1.0
        )


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("length", [1, 16, 37, 1000])
def test_gather_head_major_is_the_gathered_context_transposed(length, threads):
    _, k_cache, _, tables, _, _ = paged_decode_case([length, 5], 9, 3, 64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_kernels.gather_head_major(k_cache, tables[0], length)
    finally:
        torch.set_num_threads(before)
    want = gather_kv(k_cache, tables[0], length).transpose(0, 1)
    assert got.is_contiguous() and torch.equal(got, want)


@needs_kernel
def test_gather_head_major_rejects_what_it_cannot_read():
    _, k_cache, _, tables, _, _ = paged_decode_case([20], 2, 1, 16)
    with pytest.raises(ValueError, match="bf16"):
        cpu_kernels.gather_head_major(k_cache.float(), tables[0], 20)
    with pytest.raises(ValueError, match="int64"):
        cpu_kernels.gather_head_major(k_cache, tables[0].int(), 20)
    with pytest.raises(ValueError, match="cannot hold"):
        cpu_kernels.gather_head_major(k_cache, tables[0, :1], 20)


@needs_kernel
def test_bf16_chunks_held_whole_go_through_the_compiled_kernels(monkeypatch):
    monkeypatch.setattr(attention, "_HELD_WHOLE_DTYPES", {torch.bfloat16})
    gathers = spy(monkeypatch, "gather_head_major")
    softmaxes = spy(monkeypatch, "causal_softmax_")
    _, k_cache, v_cache, tables, _, _ = paged_decode_case([37], 9, 3, 64)
    q = torch.randn(5, 9, 64).bfloat16()
    meta = AttentionMetadata(torch.full((5,), -1), tables, [0, 5], [37])
    paged_attention(q, k_cache, v_cache, meta, 0.125)
    assert [a[2] for a in gathers] == [37, 37]  # K and V
    assert [(tuple(a[0].shape), a[1]) for a in softmaxes] == [((3, 3 * 5, 37), 5)]


@needs_kernel
def test_decodes_go_through_the_compiled_kernel(monkeypatch):
    calls = spy(monkeypatch, "paged_decode_attention")
    query, k_cache, v_cache, tables, lens, _ = paged_decode_case([20, 7], 9, 3, 64)
    slots = torch.tensor([-1, -1])  # nothing new to store
    meta = AttentionMetadata(slots, tables, [0, 1, 2], [20, 7])
    paged_attention(query, k_cache, v_cache, meta, 0.125)
    assert [a[4].tolist() for a in calls] == [[20, 7]]
    assert cpu_kernels.runs_decode(k_cache)
    assert not cpu_kernels.runs_decode(k_cache.float())


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 576), (37, 576), (300, 64), (4, 40), (2, 5, 24)])
def test_rms_norm_matches_torch_within_one_bf16_step(shape, threads):
    torch.manual_seed(shape[0])
    dim = shape[-1]
    x = (torch.randn(shape) * 3).bfloat16()
    weight = (torch.randn(dim) * 0.3 + 1).bfloat16()
    want = weight * torch.nn.functional.rms_norm(x, (dim,), eps=1e-5)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_kernels.rms_norm(x, weight, 1e-5)
    finally:
        torch.set_num_threads(before)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    steps = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
    # Same roundings in the same order; only the fp32 sum's order differs.
    assert steps.max().item() <= 1
    assert (steps > 0).float().mean().item() < 1e-3


@needs_kernel
def test_rms_norm_rejects_what_it_cannot_read():
    w = torch.ones(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bf16"):
        cpu_kernels.rms_norm(torch.ones(2, 8), w, 1e-5)
    with pytest.raises(ValueError, match="weight of their size"):
        cpu_kernels.rms_norm(torch.ones(2, 6, dtype=torch.bfloat16), w, 1e-5)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_kernels.rms_norm(torch.ones(8, 2, dtype=torch.bfloat16).t(), w, 1e-5)


@needs_kernel
def test_the_models_rms_norm_goes_through_the_compiled_kernel_in_bf16(monkeypatch):
    from inference.models.llama import RMSNorm

    calls = spy(monkeypatch, "rms_norm")
    norm = RMSNorm(16, 1e-6)
    x = torch.randn(3, 16)
    norm.forward(x)  # fp32: torch's ops
    assert calls == []
    norm.bfloat16().forward(x.bfloat16())
    assert len(calls) == 1


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """A cold library lookup with its own cache dir, restored afterwards."""
    monkeypatch.setenv("PREFIXCHAT_KERNEL_CACHE", str(tmp_path))
    cpu_kernels._library.cache_clear()
    yield tmp_path
    cpu_kernels._library.cache_clear()


@needs_kernel
def test_the_library_is_built_once_per_source_and_reused(fresh_library, monkeypatch):
    first = cpu_kernels.build(cpu_kernels.compiler(), fresh_library)
    assert first.exists() and list(fresh_library.iterdir()) == [first]

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert cpu_kernels.build(cpu_kernels.compiler(), fresh_library) == first
    assert cpu_kernels.available()


def test_off_the_avx512_bf16_path_nothing_is_compiled(fresh_library, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "cpu_path", lambda: "avx2")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("compiled"))
    assert not cpu_kernels.available()
    with pytest.raises(RuntimeError, match="not available"):
        cpu_kernels.causal_softmax_(torch.zeros(2, 2, dtype=torch.bfloat16), 1)


def test_a_failed_compile_falls_back_to_torch_with_a_warning(fresh_library, monkeypatch, caplog):
    monkeypatch.setattr(cpu_kernels, "cpu_path", lambda: "avx512-bf16")
    monkeypatch.setenv("CC", "false")
    with caplog.at_level(logging.WARNING, logger="kernels.c_build"):
        assert not cpu_kernels.available()
    assert "keeping torch ops" in caplog.text
    assert list(fresh_library.iterdir()) == []  # no half-built library left behind
    # Attention still runs, on torch's softmax.
    monkeypatch.setattr(attention, "_HELD_WHOLE_DTYPES", {torch.bfloat16})
    q, k = torch.randn(3, 2, 8).bfloat16(), torch.randn(9, 2, 8).bfloat16()
    mask = AttentionMetadata(torch.zeros(3), torch.zeros(1, 1), [0, 3], [9]).chunk_mask(
        3, 1, torch.bfloat16
    )
    k = k.transpose(0, 1).contiguous()
    assert attention._attend_held_whole(q, k, k, mask, 8**-0.5).shape == (3, 2, 8)


def test_no_compiler_means_no_kernel(fresh_library, monkeypatch, caplog):
    monkeypatch.setattr(cpu_kernels, "cpu_path", lambda: "avx512-bf16")
    monkeypatch.setattr(cpu_kernels, "compiler", lambda: None)
    with caplog.at_level(logging.WARNING, logger="kernels.c_build"):
        assert not cpu_kernels.available()
    assert "no C compiler" in caplog.text


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("shape", [(576, 960), (1536, 576), (64, 17), (128, 1), (576, 49152)])
def test_bf16_matmul_matches_fp32_sums_of_bf16_products(rows, shape):
    """The few-row bf16 matmul of the decode step: exact products, fp32 sums, one
    rounding to bf16 (within a bf16 step of the fp64 product, plus fp32 sums)."""
    inp, out = shape
    g = torch.Generator().manual_seed(rows + out)
    x = torch.randn(rows, inp, generator=g).bfloat16()
    w = (torch.randn(out, inp, generator=g) / inp**0.5).bfloat16()
    got = cpu_kernels.bf16_matmul(x, w)
    assert got.shape == (rows, out) and got.dtype == torch.bfloat16
    # Plain bf16 linear layers take it for their few rows.
    assert torch.equal(cpu_linear.linear(x, w), got)
    ref = x.double() @ w.double().T
    bound = ref.abs() * 2**-8 + 1e-5 * (x.abs().double() @ w.abs().double().T) + 1e-6
    assert ((got.double() - ref).abs() <= bound).all()


@needs_kernel
def test_bf16_matmul_rejects_what_it_cannot_read():
    x = torch.randn(2, 128).bfloat16()
    w = torch.randn(10, 128).bfloat16()
    bad = {
        "fp32 rows": (x.float(), w),
        "fp32 weight": (x, w.float()),
        "nine rows": (torch.randn(9, 128).bfloat16(), w),
        "a width of 96": (torch.randn(2, 96).bfloat16(), torch.randn(10, 96).bfloat16()),
        "widths that differ": (x, torch.randn(10, 192).bfloat16()),
        "strided weight": (x, torch.randn(128, 10).bfloat16().T),
    }
    for name, (a, b) in bad.items():
        assert not cpu_kernels.runs_bf16_matmul(a, b), name
        with pytest.raises(ValueError):
            cpu_kernels.bf16_matmul(a, b)
