"""What the fp32 kernels' integer dots may add to a matmul's error (csrc/f32/linear.c)."""

import dataclasses

import torch
import torch.nn.functional as F

from kernels import f32_kernels
from kernels import quant_linear as ql


def takes_int16(x: torch.Tensor, kind: str) -> bool:
    """True where the kernel rounds x's rows to int16: one or two fp32 rows of a
    quantized kind, on a build with the integer dots."""
    return (x.dtype == torch.float32 and x.reshape(-1, x.shape[-1]).shape[0]
            <= f32_kernels.INT_DOT_ROWS and kind in ql.QUANT_KINDS and f32_kernels.int_dots())


def levels_part(qw: ql.QuantizedWeight) -> torch.Tensor:
    """The part of each dequantized weight that the kernels multiply on the levels (q d
    for int8 and int4, q step for uint8), without the group's offset (m, m - 8 step),
    which they apply to the exact sum of the activations."""
    offsets = ql.dequantize(dataclasses.replace(qw, data=torch.zeros_like(qw.data)))
    return ql.dequantize(qw) - offsets


def int16_rounding_bound(x: torch.Tensor, qw: ql.QuantizedWeight) -> torch.Tensor:
    """The most that rounding x's rows to int16 a group of 32 moves x w^T: half a step
    (amax / 65534) of each group times the sum of its weights' |levels part|, with 1 %
    for the fp32 roundings of the scales. x [rows, in]; fp64 [rows, out]."""
    w = levels_part(qw)
    pad = -x.shape[1] % 32
    xg = F.pad(x.double(), (0, pad)).view(x.shape[0], -1, 32)
    wg = F.pad(w.double().abs(), (0, pad)).view(w.shape[0], -1, 32).sum(-1)
    return (xg.abs().amax(-1) / 65534.0 * 1.01) @ wg.T


def rounded_to_int16(x: torch.Tensor) -> torch.Tensor:
    """x's rows as the integer dots see them: each group of 32 rounded half to even on
    a step of its amax / 32767 (the multiply by 32767 / amax in fp32, as the kernel
    does). fp64."""
    amax = x.view(x.shape[0], -1, 32).abs().amax(-1, keepdim=True)
    levels = torch.round(x.view(x.shape[0], -1, 32) * (32767.0 / amax)).double()
    return (levels * (amax / 32767.0).double()).view_as(x)
