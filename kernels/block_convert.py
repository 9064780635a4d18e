"""GGUF blocks converted onto our layouts in C where a loader would otherwise take a
slow detour (csrc/blocks/): Q6_K onto the uint8 kind, bit for bit what dequantizing
and quantize(values, "uint8") give. None where no compiler is here: the caller keeps
that detour."""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import numpy as np
import torch

from kernels import c_build
from kernels.quant_layout import GROUP
from kernels.quant_linear import QuantizedWeight

CSRC = Path(__file__).resolve().parent / "csrc" / "blocks"
SOURCES = (CSRC / "q6k.c",)
# No contraction into FMAs: the same roundings as the numpy and torch ops it replaces.
CFLAGS = ("-O3", "-std=c11", "-fopenmp", "-ffp-contract=off", "-fno-math-errno")
Q6_K_BLOCK, Q6_K_BYTES = 256, 210


@cache
def _library() -> ctypes.CDLL | None:
    lib = c_build.load("block_convert", SOURCES, (), CFLAGS, c_build.compiler())
    if lib is not None:
        lib.q6k_to_uint8.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                     ctypes.c_void_p]
        lib.q6k_to_uint8.restype = None
    return lib


def q6k_to_uint8(raw: np.ndarray, cols: int) -> QuantizedWeight | None:
    """Q6_K rows [rows, row_bytes] as a uint8 weight, or None without the C library."""
    lib = _library()
    if lib is None or cols % Q6_K_BLOCK:
        return None
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    rows = raw.shape[0]
    nblocks = rows * cols // Q6_K_BLOCK
    if raw.size != nblocks * Q6_K_BYTES:
        raise ValueError(f"{raw.size} bytes are not {nblocks} Q6_K blocks")
    levels = torch.empty(rows, cols, dtype=torch.uint8)
    scale = torch.empty(rows, cols // GROUP, 2, dtype=torch.float16)
    lib.q6k_to_uint8(raw.ctypes.data, nblocks, levels.data_ptr(), scale.data_ptr())
    return QuantizedWeight("uint8", levels, scale, cols)
