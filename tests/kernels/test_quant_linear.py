"""Weight-only quantized matmuls: formats, the C kernels and the torch fallback."""

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_kernels, f32_kernels, quant_layout
from kernels import quant_linear as ql
from kernels.c_build import compiler
from kernels.cpu_features import cpu_path
from tests.kernels.rounding import int16_rounding_bound, takes_int16

needs_kernel = pytest.mark.skipif(
    not cpu_kernels.quant_available(), reason="no AVX512-BF16 or no C compiler here"
)

SHAPES = [(576, 1536), (1536, 576), (17, 100), (100, 17), (64, 64), (33, 1), (8, 2200)]


def weight(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g) / inp**0.5


def check_close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                bias: torch.Tensor | None = None, qw: ql.QuantizedWeight | None = None) -> None:
    """got is x w^T up to fp32 sums and, for bf16, roundings (and, where got is
    (x w^T + bias) - bias, the two roundings that adding and taking away the bias cost);
    for one or two fp32 rows of a quantized weight qw on the integer dots, up to rounding
    x to int16 too."""
    ref = x.double() @ w.double().T
    bound = 1e-5 * (x.abs().double() @ w.abs().double().T) + 1e-6
    if qw is not None and takes_int16(x, qw.kind):
        bound = bound + int16_rounding_bound(x, qw)
    if got.dtype == torch.bfloat16 or x.dtype == torch.bfloat16:
        # bf16 roundings of the output, and of each weight and partial sum where a bf16
        # matmul takes the dequantized weight
        bound = bound + ref.abs() * 2**-8 + (x.abs().double() @ w.abs().double().T) * 2**-7
        if bias is not None:
            bound = bound + bias.abs().double() * 2**-7
    err = (got.double() - ref).abs()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item()}"


def kernel_expected(dtype: torch.dtype, kind: str) -> bool:
    """What this host's path must run in C: fp32 rows on every path (the fp32 kernels),
    bf16 rows of a quantized kind on avx512-bf16 only; nothing without a compiler."""
    if compiler() is None:
        return False
    return dtype == torch.float32 or (kind != "bf16" and cpu_path() == "avx512-bf16")


@pytest.mark.parametrize("kind", ql.KINDS)
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_the_dequantized_reference(kind, rows, shape, dtype):
    inp, out = shape
    qw = ql.quantize(weight(out, inp, seed=rows), kind)
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(inp)).to(dtype)
    assert ql.runs_kernel(x, qw) == kernel_expected(dtype, kind)
    got = ql.kernel_matmul(x, qw) if ql.runs_kernel(x, qw) else ql.quant_linear(x, qw)
    assert got.shape == (rows, out) and got.dtype == dtype
    check_close(got, x, ql.dequantize(qw), qw=qw)


@needs_kernel
@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
@pytest.mark.parametrize("rows", [1, 3])
def test_kernel_on_the_output_projection_shape(kind, rows):
    qw = ql.quantize(weight(49152, 576), kind)
    x = torch.randn(rows, 576).bfloat16()
    check_close(ql.kernel_matmul(x, qw), x, ql.dequantize(qw))


@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
@pytest.mark.parametrize("rows", [1, 2, 9, 33])
@pytest.mark.parametrize("shape", [(576, 1536), (100, 17), (17, 100)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quant_linear_dispatch_matches_the_reference(kind, rows, shape, dtype):
    """Whatever path a call takes (kernel, C dequantizer + oneDNN, torch), the result
    is the dequantized weight's product, with a bias added."""
    inp, out = shape
    qw = ql.quantize(weight(out, inp, seed=3), kind)
    x = torch.randn(rows, inp).to(dtype)
    bias = torch.randn(out).to(dtype)
    got = ql.quant_linear(x, qw, bias) - bias
    check_close(got, x, ql.dequantize(qw), bias, qw)
    # Leading dims pass through.
    assert ql.quant_linear(x.view(1, rows, inp), qw).shape == (1, rows, out)


@pytest.mark.parametrize("kind", ql.KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_the_same_result_alone_or_in_a_large_batch(kind, dtype):
    """Decode rows (the kernel) and prefill rows (dequantize, then oneDNN) take the
    same weights, exact in fp32 and rounded to bf16 in bf16, so they differ only in the
    order of their fp32 sums, and a lone fp32 row on the integer dots by its int16
    rounding: a prefix recomputed after preemption matches its decode to the output's
    last rounding. (Exact weights in a bf16 decode made 42 % of these outputs differ, by
    up to 4 bf16 ulps.)"""
    if not kernel_expected(dtype, kind):
        pytest.skip(f"this path has no C kernel for {dtype} rows of {kind}")
    qw = ql.quantize(weight(300, 576, seed=9), kind)
    batch = torch.randn(40, 576, generator=torch.Generator().manual_seed(5)).to(dtype)
    together = ql.quant_linear(batch, qw).double()
    ulp = 0.0 if dtype == torch.float32 else 2**-8  # one output rounding
    for i in (0, 17, 39):
        alone = ql.quant_linear(batch[i : i + 1], qw).double()
        assert ql.runs_kernel(batch[i : i + 1], qw) and not ql.runs_kernel(batch, qw)
        scale = batch[i].double().abs() @ ql.dequantize(qw).double().abs().T
        bound = 2e-6 * scale + ulp * together[i].abs()
        if takes_int16(batch[i : i + 1], kind):
            bound = bound + int16_rounding_bound(batch[i : i + 1], qw)[0]
        assert ((alone[0] - together[i]).abs() <= bound).all()


@needs_kernel
@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (100, 17)])
def test_bf16_rows_get_the_bf16_matmul_of_the_dequantized_weight(kind, rows, shape):
    """With bf16 x the kernel multiplies by the weight rounded to bf16, summing as the
    plain bf16 decode matmul does: bit for bit what a bf16 engine holding the
    dequantized weight computes, so int8 and int4 engines decode as it does."""
    inp, out = shape
    qw = ql.quantize(weight(out, inp, seed=rows), kind)
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(out)).bfloat16()
    pad = quant_layout.padded(inp) - inp
    plain = F.pad(ql.dequantize(qw, torch.bfloat16), (0, pad)).contiguous()
    want = cpu_kernels.bf16_matmul(F.pad(x, (0, pad)).contiguous(), plain)
    assert torch.equal(ql.kernel_matmul(x, qw), want)


@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
def test_round_trip_error_bounds(kind):
    w = weight(96, 200, seed=5) * torch.linspace(0.1, 10, 96)[:, None]  # rows of many scales
    w[7] = 0  # an all-zero row must not divide by zero
    qw = ql.quantize(w, kind)
    back = ql.dequantize(qw)
    assert back.shape == w.shape and torch.isfinite(back).all()
    assert (back[7] == 0).all()
    err = (back - w).abs()
    groups = F.pad(w, (0, 56)).view(96, -1, 32)
    gerr = F.pad(err, (0, 56)).view(96, -1, 32)
    assert qw.scale.dtype == torch.float16
    if kind == "int8":
        # half a step of the group's own scale (its fp16 rounding adds at most 2^-11)
        assert (gerr <= groups.abs().amax(-1, keepdim=True) / 254 * (1 + 2**-10) + 1e-12).all()
        assert qw.data.dtype == torch.int8 and qw.data.shape == (96, 256)
        assert qw.scale.shape == (96, 8)
    else:
        # half a step of the group's range over its 15 or 255 steps, plus the fp16
        # roundings of the minimum and the step
        steps = 240 if kind == "uint8" else 15
        lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        slack = (lo.abs() + hi.abs()) * 2**-10 + 1e-12
        assert (gerr <= (hi - lo) / (2 * steps) + slack).all()
        assert qw.data.dtype == torch.uint8 and qw.data.shape == (96, 256 if kind == "uint8" else 128)
        assert qw.scale.shape == (96, 8, 2)
    if kind == "uint8":  # coarser than int8's grid only where a group is symmetric
        sym = (ql.dequantize(ql.quantize(w, "int8")) - w).abs()
        assert err.mean() < sym.mean()


def gguf_weight(kind: str) -> tuple[torch.Tensor, ...]:
    """A weight [40, 576] on GGUF's Q8_0 or Q4_1 grid (fp16 steps and minimums, every
    group reaching its extreme levels, as llama.cpp's quantizer leaves it); its levels
    and steps too."""
    g = torch.Generator().manual_seed(11)
    out, groups = 40, 18
    d = (torch.rand(out, groups, 1, generator=g) * 0.01 + 1e-4).half().float()
    if kind == "int8":
        q = torch.randint(-127, 128, (out, groups, 32), generator=g).float()
        q[:, :, 0] = 127 * torch.sign(torch.randn(out, groups, generator=g))
        w = q * d
    else:
        q = torch.randint(0, 16, (out, groups, 32), generator=g).float()
        q[:, :, 0], q[:, :, 1] = 0, 15
        m = (-torch.rand(out, groups, 1, generator=g) * 0.1).half().float()
        w = q * d + m
    return w.view(out, -1), q.view(out, -1), d


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_gguf_weight_comes_back_exactly(kind):
    """A Q8_0 or Q4_1 weight quantizes to the same grid: the shipped SmolLM2 loses
    nothing more."""
    w, _, _ = gguf_weight(kind)
    assert torch.equal(ql.dequantize(ql.quantize(w, kind)), w)


def test_uint8_holds_a_q4_1_weight_on_its_levels():
    """uint8 finds a Q4_1 group's own d and m and puts its level k on level 16 k + 8: the
    weight comes back bit for bit, where int8's grid moves it by up to half a step of
    its own."""
    w, q4, _ = gguf_weight("int4")
    qw = ql.quantize(w, "uint8")
    assert torch.equal(qw.data.float(), 16 * q4 + 8)
    assert torch.equal(qw.scale, ql.quantize(w, "int4").scale)
    assert torch.equal(ql.dequantize(qw), w)
    assert not torch.equal(ql.dequantize(ql.quantize(w, "int8")), w)


@needs_kernel
@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_c_dequantizer_matches_torch(kind, shape):
    inp, out = shape
    qw = ql.quantize(weight(out, inp), kind)
    ref = ql.dequantize(qw)
    assert torch.equal(ql.dequantize_for_matmul(qw, torch.float32), ref)
    assert torch.equal(ql.dequantize_for_matmul(qw, torch.bfloat16), ref.bfloat16())


def test_quantize_refuses_bad_weights():
    with pytest.raises(ValueError, match="kind"):
        ql.quantize(torch.randn(4, 4), "int3")
    with pytest.raises(ValueError, match="2-D"):
        ql.quantize(torch.randn(4), "int8")
    with pytest.raises(ValueError, match="2-D"):
        ql.quantize(torch.ones(4, 4, dtype=torch.int32), "int8")


@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
def test_the_stored_layout_checks_a_weights_tensors(kind):
    """One description of each kind's tensors: what quantize makes passes it, and a
    wrong kind, dtype, shape or width is refused by name (the C binding calls it)."""
    qw = ql.quantize(weight(40, 100), kind)
    assert quant_layout.check(kind, qw.data, qw.scale, 100) == 128
    other = "int4" if kind != "int4" else "int8"
    refused = {
        "kind": ("int3", qw.data, qw.scale, 100),
        "scales": (kind, qw.data, qw.scale.float(), 100),
        "columns": (kind, qw.data, qw.scale, 130),
        "another kind's": (other, qw.data, qw.scale, 100),
        "no columns": (kind, qw.data, qw.scale, 0),
        "a 1-D weight": (kind, qw.data.reshape(-1), qw.scale, 100),
        "dropped scales": (kind, qw.data, qw.scale[:, :-1], 100),
    }
    for what, args in refused.items():
        with pytest.raises(ValueError):
            quant_layout.check(*args)
            pytest.fail(what)
    with pytest.raises(ValueError, match="kind"):
        quant_layout.check(*refused["kind"])
    with pytest.raises(ValueError, match="scales"):
        quant_layout.check(*refused["scales"])
    with pytest.raises(ValueError, match="columns"):
        quant_layout.check(*refused["columns"])


@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
def test_kernel_refuses_bad_inputs(kind):
    """fp32 rows (the fp32 kernels, on every path) are checked before any C runs."""
    qw = ql.quantize(weight(40, 100), kind)
    good = torch.randn(2, 100)
    assert ql.kernel_matmul(good, qw).shape == (2, 40)
    bad = {
        "float16 rows": good.half(),
        "int rows": good.int(),
        "wrong width": torch.randn(2, 99),
        "non-contiguous rows": torch.randn(100, 2).T,
        "too many rows": torch.randn(f32_kernels.MAX_ROWS + 1, 100),
        "no rows": torch.randn(0, 100),
        "3-D rows": torch.randn(1, 2, 100),
    }
    for what, x in bad.items():
        with pytest.raises(ValueError):
            ql.kernel_matmul(x, qw)
            pytest.fail(what)
    with pytest.raises(ValueError, match="input features"):
        ql.quant_linear(torch.randn(2, 99), qw)
    wrong_scale = ql.QuantizedWeight(kind, qw.data, qw.scale.double(), 100)
    with pytest.raises(ValueError, match="scales"):
        ql.kernel_matmul(good, wrong_scale)
    with pytest.raises(ValueError, match="columns"):
        ql.kernel_matmul(torch.randn(2, 300), ql.QuantizedWeight(kind, qw.data, qw.scale, 300))
    with pytest.raises(ValueError):
        f32_kernels.dequantize(kind, qw.data, qw.scale.double(), 100)
    if cpu_kernels.quant_available():  # the bf16 library: avx512-bf16 only
        with pytest.raises(ValueError):
            cpu_kernels.dequantize(kind, qw.data, qw.scale, 100, torch.float16)


@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
@pytest.mark.parametrize("rows", [1, 9])
def test_torch_fallback_where_the_kernels_do_not_run(kind, rows, monkeypatch):
    """No AVX512-BF16, no compiler (or CUDA): torch dequantizes and multiplies."""
    monkeypatch.setattr(cpu_kernels, "quant_available", lambda: False)
    monkeypatch.setattr(f32_kernels, "available", lambda: False)
    monkeypatch.setattr(cpu_kernels, "quant_linear", None)  # never reached
    monkeypatch.setattr(cpu_kernels, "dequantize", None)
    monkeypatch.setattr(f32_kernels, "linear", None)
    qw = ql.quantize(weight(100, 17), kind)
    x = torch.randn(rows, 17)
    assert not ql.runs_kernel(x, qw)
    check_close(ql.quant_linear(x, qw), x, ql.dequantize(qw))
    check_close(ql.quant_linear(x.bfloat16(), qw), x.bfloat16(), ql.dequantize(qw))


@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_many_rows_dequantize_the_weight_in_slices(kind, dtype, monkeypatch):
    monkeypatch.setattr(ql, "DEQUANT_TILE_BYTES", 1)  # slices of 256 output rows
    qw = ql.quantize(weight(700, 100, seed=4), kind)
    x = torch.randn(2, 12, 100).to(dtype)
    bias = torch.randn(700).to(dtype)
    got = ql.quant_linear(x, qw, bias)
    assert got.shape == (2, 12, 700)
    check_close((got - bias).view(24, 700), x.view(24, 100), ql.dequantize(qw))


@pytest.mark.parametrize("kind", ql.QUANT_KINDS)
def test_tall_weights_quantize_in_slices_as_a_whole(kind, monkeypatch):
    w = weight(50, 70, seed=11)
    whole = ql.quantize(w, kind)
    monkeypatch.setattr(ql, "CHUNK_ROWS", 16)
    sliced = ql.quantize(w, kind)
    assert torch.equal(sliced.data, whole.data) and torch.equal(sliced.scale, whole.scale)
    assert sliced.data.is_contiguous() and sliced.scale.is_contiguous()
