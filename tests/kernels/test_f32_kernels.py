"""The fp32 C kernels (kernels/f32_kernels, csrc/f32/): what every path but
avx512-bf16 decodes with, held to torch's fp32 reference; the portable build that
ARM64 and other CPUs get; and the choice of path (kernels/cpu_features)."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels import attention, c_build, cpu_features, f32_kernels, kv_quant
from kernels import quant_linear as ql
from kernels.cpu_features import cpu_path
from tests.kernels.rounding import int16_rounding_bound, rounded_to_int16, takes_int16

pytestmark = pytest.mark.skipif(c_build.compiler() is None, reason="needs a C compiler")

ROOT = Path(__file__).resolve().parents[2]


def weight(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g) / inp**0.5


def test_the_fp32_kernels_run_on_every_path():
    assert f32_kernels.available()
    avx2 = cpu_path() in ("avx512-bf16", "avx2")
    assert ("-mavx2" in f32_kernels.cflags()) == avx2
    assert f32_kernels.int_dots() == avx2


@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
def test_a_decode_row_takes_zero_and_tiny_groups(kind):
    """Groups of zeros, of fp32's smallest normals and of subnormals beside ordinary
    ones: every output finite and as near x w^T as the rounding allows."""
    qw = ql.quantize(weight(24, 192, seed=3), kind)
    dq = ql.dequantize(qw).double()
    x = torch.randn(1, 192, generator=torch.Generator().manual_seed(4))
    x[:, :32] = 0
    x[:, 32:64] *= 1e-38
    x[:, 64:96] *= 1e-44
    got = f32_kernels.linear(x, kind, qw.data, qw.scale, 192).double()
    assert torch.isfinite(got).all()
    bound = 1e-5 * (x.abs().double() @ dq.abs().T) + 1e-30
    if takes_int16(x, kind):
        bound = bound + int16_rounding_bound(x, qw)
    assert ((got - x.double() @ dq.T).abs() <= bound).all()


@pytest.mark.parametrize("rows", [1, 2])
def test_a_decode_row_is_rounded_a_group_at_a_time(rows):
    """One group of a row ten thousand times larger than the rest: where the integer
    dots run, each group of 32 is rounded on its own scale, so the small groups keep
    their four and a half digits; a scale for the whole row would round them away."""
    w = weight(40, 2048, seed=7)
    qw = ql.quantize(w, "int8")
    dq = ql.dequantize(qw).double()
    x = torch.randn(rows, 2048, generator=torch.Generator().manual_seed(rows)) * 1e-4
    x[:, 64:96] *= 1e4
    got = f32_kernels.linear(x, "int8", qw.data, qw.scale, 2048).double()
    fp32_sums = 1e-5 * (x.abs().double() @ dq.abs().T) + 1e-7
    if not f32_kernels.int_dots():
        assert ((got - x.double() @ dq.T).abs() <= fp32_sums).all()
        return
    assert ((got - rounded_to_int16(x) @ dq.T).abs() <= fp32_sums).all()
    # What the small groups add is far above that tolerance: rounding them on the large
    # group's step would have failed the check above.
    small = x.clone()
    small[:, 64:96] = 0
    assert ((small.double() @ dq.T).abs() > 10 * fp32_sums).any()


@pytest.mark.parametrize("kind", ql.KINDS)
@pytest.mark.parametrize("shape", [(576, 1536), (100, 17), (3, 64)])
def test_the_dequantizer_gives_torchs_weights_bit_for_bit(kind, shape):
    qw = ql.quantize(weight(*shape, seed=5), kind)
    got = f32_kernels.dequantize(kind, qw.data, qw.scale, qw.in_features)
    assert torch.equal(got, ql.dequantize(qw))


@pytest.mark.parametrize("rows", [1, 2, 8])
def test_plain_fp32_weights_multiply_as_f_linear(rows):
    w = weight(130, 128, seed=rows)
    x = torch.randn(rows, 128)
    got = f32_kernels.linear(x, "fp32", w.contiguous(), None, 128)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, kv_quant.POOL_DTYPE])
def test_a_prefills_k_and_v_are_stored_as_torch_stores_them(cache_dtype):
    """The K and V of a fused qkv projection's rows (views into it), stored in one C pass:
    the same bytes as torch's ops give (bf16 to nearest even; int8 rows as
    kv_quant.quantize), padding slots (-1) left alone."""
    torch.manual_seed(8)
    tokens, heads, kv_heads, head_dim, block_size, blocks = 37, 9, 3, 64, 16, 8
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim) * 3
    qkv[5, heads * head_dim : (heads + kv_heads) * head_dim] = 0  # an all-zero row: scale 0
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)
    slots = torch.randperm(blocks * block_size)[:tokens]
    slots[[3, 20]] = -1
    shape = (blocks, block_size, kv_heads, kv_quant.pool_last_axis(head_dim, cache_dtype))
    got_k, got_v = torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype)
    want_k, want_v = got_k.clone(), got_v.clone()
    assert f32_kernels.runs_store_kv(k, v, got_k)
    f32_kernels.store_kv(k, v, got_k, got_v, slots)
    keep = slots >= 0
    for cache, x in ((want_k, k), (want_v, v)):
        x = x[keep]
        rows = kv_quant.quantize(x) if cache_dtype == kv_quant.POOL_DTYPE else x.to(cache_dtype)
        cache.view(-1, *shape[2:]).index_copy_(0, slots[keep], rows)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    with pytest.raises(ValueError):
        f32_kernels.store_kv(k, v, got_k, got_v, slots.int())
    with pytest.raises(ValueError, match="past the end"):
        f32_kernels.store_kv(k, v, got_k * 0, got_v, slots + blocks * block_size)
    assert torch.equal(got_v, want_v)  # refused before any write


def reference_decode(q, k_cache, v_cache, tables, lens, scale):
    """Each row's attention over its first lens[b] tokens, gathered through its table."""
    out = torch.empty_like(q)
    kv_heads = k_cache.shape[2]
    for b in range(q.shape[0]):
        n = int(lens[b])
        k = attention.gather_kv(k_cache, tables[b], n).transpose(0, 1)  # [kv, n, D]
        v = attention.gather_kv(v_cache, tables[b], n).transpose(0, 1)
        group = q.shape[1] // kv_heads
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        probs = torch.softmax((q[b][:, None, :] @ k.transpose(1, 2)) * scale, dim=-1)
        out[b] = (probs @ v)[:, 0]
    return out


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 16), (8, 2, 256)])
@pytest.mark.parametrize("lens", [[1], [17, 5, 64], [300, 33]])
def test_paged_decode_attention_matches_the_reference(heads, kv_heads, head_dim, lens):
    torch.manual_seed(len(lens) + head_dim)
    block_size, blocks = 16, 64
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim)
    v_cache = torch.randn(blocks, block_size, kv_heads, head_dim)
    width = max(-(-n // block_size) for n in lens)
    tables = torch.stack([torch.randperm(blocks)[:width] for _ in lens])
    lens_t = torch.tensor(lens)
    q = torch.randn(len(lens), heads, head_dim)
    got = f32_kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens_t, head_dim**-0.5)
    want = reference_decode(q, k_cache, v_cache, tables, lens_t, head_dim**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 40])
def test_paged_decode_attention_reads_a_bf16_cache_as_its_fp32_widening(window):
    """A bf16 cache (an fp32 engine's compact KV) is widened in registers: the same
    attention as over the fp32 cache holding the same values."""
    torch.manual_seed(3)
    block_size, blocks, heads, kv_heads, head_dim = 16, 64, 9, 3, 64
    k16 = torch.randn(blocks, block_size, kv_heads, head_dim).bfloat16()
    v16 = torch.randn(blocks, block_size, kv_heads, head_dim).bfloat16()
    tables = torch.stack([torch.randperm(blocks)[:20] for _ in range(3)])
    lens = torch.tensor([300, 17, 1])
    q = torch.randn(3, heads, head_dim)
    assert f32_kernels.runs_decode(k16)
    got = f32_kernels.paged_decode_attention(q, k16, v16, tables, lens, 0.125, window)
    want = f32_kernels.paged_decode_attention(q, k16.float(), v16.float(), tables, lens, 0.125,
                                              window)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_attention_refuses_what_it_cannot_read():
    k = torch.randn(4, 16, 2, 20)  # head_dim not a multiple of 8
    assert not f32_kernels.runs_decode(k)
    with pytest.raises(ValueError, match="head_dim"):
        f32_kernels.paged_decode_attention(torch.randn(1, 2, 20), k, k, torch.zeros(1, 1).long(),
                                           torch.tensor([3]), 1.0)
    with pytest.raises(ValueError):
        f32_kernels.paged_decode_attention(torch.randn(1, 2, 16).bfloat16(), k, k,
                                           torch.zeros(1, 1).long(), torch.tensor([3]), 1.0)
    half = torch.randn(4, 16, 2, 16).half()  # neither fp32 nor bf16
    assert not f32_kernels.runs_decode(half)
    with pytest.raises(ValueError):
        f32_kernels.paged_decode_attention(torch.randn(1, 2, 16), half, half,
                                           torch.zeros(1, 1).long(), torch.tensor([3]), 1.0)


def test_the_portable_build_computes_what_the_vector_one_does(tmp_path):
    """What ARM64 and CPUs without AVX2 build: the same source with the compiler's
    defaults (no -mavx2), compiled and run here for every weight kind."""
    lib = ctypes.CDLL(str(c_build.build("f32_generic", c_build.compiler(), tmp_path,
                                        f32_kernels.SOURCES, f32_kernels.HEADERS,
                                        f32_kernels.BASE_FLAGS)))
    x = torch.randn(3, 100)
    for kind in ql.KINDS:
        qw = ql.quantize(weight(70, 100, seed=2), kind)
        y = torch.empty(3, 70)
        scale = qw.scale.data_ptr() if qw.scale.numel() else None
        rc = lib.f32_linear(f32_kernels.KINDS[kind], ctypes.c_void_p(x.data_ptr()),
                            ctypes.c_int64(3), ctypes.c_int64(100), ctypes.c_int64(128),
                            ctypes.c_void_p(qw.data.data_ptr()), ctypes.c_void_p(scale),
                            ctypes.c_int64(70), ctypes.c_void_p(y.data_ptr()), ctypes.c_int(1))
        assert rc == 0
        torch.testing.assert_close(y, x @ ql.dequantize(qw).T, rtol=1e-5, atol=1e-5)


@pytest.fixture
def fresh_path(monkeypatch):
    cpu_features.cpu_path.cache_clear()
    yield monkeypatch
    cpu_features.cpu_path.cache_clear()


def test_a_forced_path_is_taken_where_the_cpu_runs_it(fresh_path, caplog):
    best = cpu_features.detected_path()
    fresh_path.setenv(cpu_features.ENV, "generic")
    assert cpu_features.cpu_path() == "generic"
    assert not cpu_features.has_native_bf16() and not cpu_features.has_amx()
    cpu_features.cpu_path.cache_clear()
    fresh_path.setenv(cpu_features.ENV, "avx2")
    assert cpu_features.cpu_path() == ("avx2" if best in ("avx512-bf16", "avx2") else best)
    cpu_features.cpu_path.cache_clear()
    fresh_path.setenv(cpu_features.ENV, "sse9")
    with caplog.at_level(logging.WARNING, logger="kernels.cpu_features"):
        assert cpu_features.cpu_path() == best
    assert "not one of" in caplog.text


def test_a_forced_path_without_the_libraries_caps_is_logged(fresh_path, caplog):
    fresh_path.setattr(cpu_features, "cpu_flags",
                       lambda: cpu_features.AVX512_BF16_FLAGS | cpu_features.AVX2_FLAGS)
    fresh_path.setattr(cpu_features, "is_arm64", lambda: False)
    for name in cpu_features.LIBRARY_ENV["avx2"]:
        fresh_path.delenv(name, raising=False)
    fresh_path.setenv(cpu_features.ENV, "avx2")
    with caplog.at_level(logging.WARNING, logger="kernels.cpu_features"):
        assert cpu_features.cpu_path() == "avx2"
    assert "MKL_ENABLE_INSTRUCTIONS=AVX2" in caplog.text
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in caplog.text
    caplog.clear()
    cpu_features.cpu_path.cache_clear()
    for name, value in cpu_features.LIBRARY_ENV["avx2"].items():
        fresh_path.setenv(name, value.lower())  # the libraries take either case
    with caplog.at_level(logging.WARNING, logger="kernels.cpu_features"):
        assert cpu_features.cpu_path() == "avx2"
    assert caplog.text == ""
    assert cpu_features.missing_library_env("avx512-bf16", {}) == {}


@pytest.mark.parametrize("target, path", [("test-avx2", "avx2"), ("test-generic", "generic")])
def test_make_forces_each_path_with_every_library_cap(target, path):
    """`make -n` prints the commands, recursive ones included, and runs none."""
    # Under `make test` the outer make's flags and variables would reach this one.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "-n", "-o", ".venv/.installed", "--no-print-directory",
                           target], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.replace("\\\n", " ").splitlines()
    line = next(x for x in lines if f"PREFIXCHAT_CPU_PATH={path}" in x)
    given = dict(w.split("=", 1) for w in line.split() if "=" in w and w[0].isupper())
    assert cpu_features.missing_library_env(path, given) == {}, line


def test_a_path_the_cpu_lacks_is_refused(fresh_path, caplog):
    fresh_path.setattr(cpu_features, "cpu_flags", lambda: frozenset({"sse2"}))
    fresh_path.setattr(cpu_features, "is_arm64", lambda: False)
    fresh_path.setenv(cpu_features.ENV, "avx512-bf16")
    with caplog.at_level(logging.WARNING, logger="kernels.cpu_features"):
        assert cpu_features.cpu_path() == "generic"
    assert "cannot run it" in caplog.text
    fresh_path.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    assert cpu_features.detected_path() == "avx2"
    fresh_path.setattr(cpu_features, "cpu_flags", lambda: frozenset())
    fresh_path.setattr(cpu_features, "is_arm64", lambda: True)
    assert cpu_features.detected_path() == "neon"


SELFTEST = f32_kernels.CSRC / "f32" / "selftest.c"


def run_selftest(cc: list[str], flags: tuple[str, ...], tmp_path, runner: list[str] = ()):
    exe = tmp_path / "selftest"
    subprocess.run([*cc, *flags, "-o", str(exe), str(SELFTEST), *map(str, f32_kernels.SOURCES),
                    "-lm"], check=True, capture_output=True, text=True, timeout=300)
    done = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 failed" in done.stdout.splitlines()[-1]


@pytest.mark.parametrize("build", ["this path", "portable"])
def test_the_kernels_own_c_test_passes_here(tmp_path, build):
    flags = f32_kernels.cflags() if build == "this path" else f32_kernels.BASE_FLAGS
    run_selftest(c_build.compiler(), flags, tmp_path)


@pytest.mark.skipif(
    not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
    reason="needs Debian's gcc-aarch64-linux-gnu and qemu-user (make test-arm64 installs them)",
)
def test_the_kernels_own_c_test_passes_on_arm64_under_qemu(tmp_path):
    """The NEON build: ARM64's widening instructions and the compiler's vectors."""
    run_selftest(["aarch64-linux-gnu-gcc"], (*f32_kernels.BASE_FLAGS, "-static"), tmp_path,
                 ["qemu-aarch64"])
