"""Q6_K onto the uint8 kind in C: bit for bit what the gguf package's dequantizer and
quantize(values, "uint8") give, over random blocks and over groups that are all one
value, all zero, or hold fp16's largest and smallest scales."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from bench.random_gguf import random_blocks
from kernels import block_convert
from kernels.quant_linear import quantize

pytestmark = pytest.mark.skipif(block_convert._library() is None, reason="needs a C compiler")


def reference(raw: np.ndarray, cols: int):
    values = np.asarray(dequantize(raw, T.Q6_K), dtype=np.float32).reshape(len(raw), cols)
    return quantize(torch.from_numpy(values), "uint8")


def check(raw: np.ndarray, cols: int) -> None:
    got, want = block_convert.q6k_to_uint8(raw, cols), reference(raw, cols)
    assert torch.equal(got.data, want.data)
    assert torch.equal(got.scale, want.scale)


def test_random_blocks():
    check(random_blocks(T.Q6_K, 64, 512, np.random.default_rng(0)), 512)


def test_edge_groups():
    rng = np.random.default_rng(1)
    raw = random_blocks(T.Q6_K, 8, 256, rng).reshape(8, 210)
    raw[0, :192] = 0x00  # every level -32 (q = 0): one value a group
    raw[1, 192:208] = 0  # scales 0: a group of zeros
    raw[2, 208:210] = np.array([0x7BFF], np.uint16).view(np.uint8)  # d = 65504
    raw[3, 208:210] = np.array([0x0001], np.uint16).view(np.uint8)  # d = 2^-24
    raw[4, 192:208] = np.array([-128] * 16, np.int8).view(np.uint8)  # negative scales
    check(raw, 256)


def test_it_refuses_rows_that_are_not_whole_blocks():
    assert block_convert.q6k_to_uint8(np.zeros((1, 105), np.uint8), 128) is None
