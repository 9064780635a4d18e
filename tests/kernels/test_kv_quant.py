"""The int8 KV cache (kernels/kv_quant): its rows, what the torch ops store and read,
and the fp32 C kernel reading the same rows."""

import pytest
import torch

from kernels import f32_kernels, kv_quant
from kernels.attention import paged_attention, store_kvcache
from tests.kernels.test_attention import DECODES, LONE_DECODE, MIXED, build_step


def test_a_row_is_its_int8_values_then_their_fp32_scale():
    # amax 15.875 = 127 / 8: scale 0.125 exactly, so every quotient is exact.
    x = torch.tensor([[1.0, -15.875, 0.0625, 0.1875], [0.0, 0.0, 0.0, 0.0]])
    rows = kv_quant.quantize(x)
    assert rows.dtype == torch.uint8 and rows.shape == (2, 4 + 4)
    assert rows[0, 4:].view(torch.float32).item() == 0.125
    assert rows[0, :4].view(torch.int8).tolist() == [8, -127, 0, 2]  # halves to even
    assert rows[1].tolist() == [0] * 8  # an all-zero row: scale 0, values 0
    back = kv_quant.dequantize(rows)
    assert back.dtype == torch.float32 and back.shape == (2, 4)
    assert back[1].tolist() == [0.0] * 4


def test_values_round_trip_within_half_a_step_of_their_row():
    torch.manual_seed(0)
    x = torch.randn(50, 3, 64) * torch.rand(50, 3, 1) * 10
    rows = kv_quant.quantize(x)
    assert kv_quant.head_dim_of(rows) == 64 and kv_quant.row_width(64) == rows.shape[-1]
    step = x.abs().amax(-1, keepdim=True) / 127
    err = (kv_quant.dequantize(rows) - x).abs()
    assert (err <= step / 2 * (1 + 1e-5)).all()
    # The largest value of each row is held exactly (up to its scale's rounding).
    torch.testing.assert_close(kv_quant.dequantize(rows).abs().amax(-1), x.abs().amax(-1))
    assert kv_quant.dequantize(rows, torch.bfloat16).dtype == torch.bfloat16


def test_store_kvcache_writes_quantized_rows_and_skips_negative_slots():
    k_cache = torch.zeros(2, 4, 1, kv_quant.row_width(8), dtype=torch.uint8)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(3, 1, 8)
    store_kvcache(key, -key, k_cache, v_cache, torch.tensor([5, -1, 0]))
    flat = k_cache.view(-1, 1, kv_quant.row_width(8))
    assert torch.equal(flat[5], kv_quant.quantize(key[0]))
    assert torch.equal(flat[0], kv_quant.quantize(key[2]))
    assert torch.equal(v_cache.view(-1, 1, 12)[0], kv_quant.quantize(-key[2]))
    assert int(flat[1:5].sum()) == int(flat[6:].sum()) == 0  # nothing else written


@pytest.mark.parametrize(
    "shapes", [MIXED, LONE_DECODE, DECODES], ids=["mixed", "lone-decode", "decodes"]
)
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("c_kernel", [True, False], ids=["c-kernel", "torch"])
def test_fp32_queries_over_an_int8_cache_attend_its_dequantized_values(
    shapes, window, c_kernel, monkeypatch
):
    """Every way a step attends over int8 rows gives what it gives over an fp32 cache
    holding their values (int8 * scale): prefill chunks in torch, decodes in the fp32
    C kernel where it runs here (or in torch where it does not)."""
    import kernels.attention as attention

    if c_kernel and not f32_kernels.available():
        pytest.skip("no C compiler for the fp32 kernels here")
    if not c_kernel:
        monkeypatch.setattr(attention, "_f32_decode_runs", lambda q, k: False)
    q, k_cache, v_cache, meta, _ = build_step(shapes, 6, 2, 64, torch.float32, num_blocks=256)
    k8, v8 = kv_quant.quantize(k_cache), kv_quant.quantize(v_cache)
    keys = torch.randn(len(meta.slot_mapping), 2, 64)
    store_kvcache(keys, -keys, k8, v8, meta.slot_mapping)
    if c_kernel and meta.decode_batch(4) is not None:
        assert f32_kernels.runs_decode(k8)
    got = paged_attention(q, k8, v8, meta, 0.125, window)
    want = paged_attention(q, kv_quant.dequantize(k8), kv_quant.dequantize(v8), meta, 0.125,
                           window)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # ... which is the fp32 cache's attention within int8's rounding.
    store_kvcache(keys, -keys, k_cache, v_cache, meta.slot_mapping)
    exact = paged_attention(q, k_cache, v_cache, meta, 0.125, window)
    torch.testing.assert_close(got, exact, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("rows", [1, 3, 500])
def test_quantize_divides_and_rounds_as_the_c_store_does(rows):
    """x / scale in IEEE fp32 and round half to even, as csrc/f32/decode.c's store_kv
    (nearbyintf) computes it: no reciprocal multiply, whatever the row count."""
    import numpy as np

    torch.manual_seed(rows)
    x = torch.randn(rows, 64) * torch.rand(rows, 1) * 5
    got = kv_quant.quantize(x)
    xn = x.numpy()
    scale = (np.abs(xn).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint(xn / scale), -127, 127).astype(np.int8)
    assert np.array_equal(got[:, :64].view(torch.int8).numpy(), q)
    assert np.array_equal(got[:, 64:].contiguous().view(torch.float32).numpy(), scale)
