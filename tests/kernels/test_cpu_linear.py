"""CPU linear layers: packed oneDNN weights and the one-row matrix-vector path."""

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu_features import cpu_path
from kernels.cpu_linear import can_pack, linear, pack_weight, packed_linear

# oneDNN packs bf16 weights on the avx512-bf16 path only (torch refuses elsewhere).
PACKS_HERE = torch.backends.mkldnn.is_available() and cpu_path() == "avx512-bf16"


@pytest.mark.parametrize("rows", [1, 3, 32, 77])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_bf16_linear_matches_f_linear(rows, with_bias):
    torch.manual_seed(rows)
    w = (torch.randn(96, 40) / 8).bfloat16()
    b = torch.randn(96).bfloat16() if with_bias else None
    x = torch.randn(rows, 40).bfloat16()
    packed = pack_weight(w, batch_hint=32)
    assert can_pack(w) == PACKS_HERE
    if not PACKS_HERE:
        assert packed is None  # the caller keeps the plain weight
        return
    assert packed is not None
    got = packed_linear(x, packed, b).float()
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    # bf16 output: one rounding of values of magnitude ~2.
    assert got.shape == (rows, 96)
    assert (got - ref).abs().max().item() < 2e-2


def test_only_bf16_cpu_weights_are_packed():
    assert pack_weight(torch.randn(8, 4)) is None  # fp32 keeps the plain path
    assert not can_pack(torch.randn(8, 4, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])
def test_linear_one_row_as_matrix_vector_matches_f_linear(dtype, rows):
    torch.manual_seed(0)
    w = torch.randn(24, 16, dtype=dtype)
    b = torch.randn(24, dtype=dtype)
    x = torch.randn(rows, 16, dtype=dtype)
    # bf16: outputs reach ~12, where one rounding step is 0.0625 (the bias adds one).
    tol = 1e-4 if dtype == torch.float32 else 0.13
    for bias in (None, b):
        got = linear(x, w, bias)
        ref = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        assert got.shape == (rows, 24) and got.dtype == dtype
        assert (got.float() - ref).abs().max().item() < tol
