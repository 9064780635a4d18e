"""Weight-only quantized linear layers: llama.cpp's Q8_0 and Q4_1 layouts of bits,
and an 8-bit grid with an offset.

Decoding one sequence reads every weight once per token, so its speed is the
memory bandwidth over the weights' size: 8 bits (8.5 or 9 a weight with their
scales) halve bf16's bytes, int4 (5 bits) nearly quarters them.

All work on groups of 32 columns of a row, with fp16 scales:
- int8: w = q * d, q = round(w / d) in [-127, 127], d = the group's largest
  magnitude / 127. (One scale per row saves half a bit but lets a row's largest
  weight set the step of all its others: it doubled SmolLM2's KL from bf16.)
- int4: w = q * d + m, q in [0, 15], m = the group's minimum, d = its range / 15.
  An offset costs half a bit over a symmetric scale but puts all 16 levels
  inside the group's range.
- uint8: w = (q - 8) * d / 16 + m, q in [0, 255], with int4's d and m: int4's grid
  with each step cut in 16, its level k at q = 16 k + 8 (a margin of 8 levels below
  the minimum, 7 above the maximum). Its step, range / 240, is at most 6 % coarser
  than int8's (2 * largest magnitude / 254, for a group symmetric about 0) and finer
  wherever a group is lopsided.

int8 and int4 are the grids of GGUF's Q8_0 and Q4_1, and a GGUF weight read as
floats has its group's extremes on levels 0/15 (±127 for Q8_0), so quantizing it
again finds the same d, m and q: SmolLM2's shipped Q4_1 (and Q8_0 head) come back
exactly, where bf16 rounds them. uint8 finds the same d and m for a Q4_1 weight,
and q * d / 16 is exact in fp32 (as is m - d / 2 where m and d are within 2^13 of
each other, in every group of SmolLM2), so the weight comes back bit for bit too (a
step of range / 255, not a binary fraction of d, moved a fifth of SmolLM2's weights
by a bf16 ulp), where Q8_0's grid, without an offset, moves it by up to half its step.

Rows are stored padded with zeros to a multiple of 64 columns (the kernel's vector
width); int8 and uint8 keep a byte a weight; int4 packs two nibbles a byte, column j
of each 64-column chunk in the low nibble of its byte j and column 32 + j in the
high one.

bf16 keeps a weight as bf16 for fp32 activations: half fp32's bytes where bf16
matmuls are not native, widened exactly in registers.

A few rows (decode) run in C, which dequantizes each weight in registers: bf16 rows
in kernels/csrc/quant_linear.c (AVX512-BF16), fp32 rows in kernels/csrc/f32/ (any
CPU); more rows multiply a copy of the weight dequantized and packed once for oneDNN
where the caller keeps one (a bf16 engine's layers do: inference/models/llama.Linear),
or, in fp32, take the own GEMM that dequantizes a panel at a time inside it
(prefill_gemm), or dequantize the weight a tile at a time and use F.linear; elsewhere
(no compiler, CUDA) torch dequantizes and multiplies. Every path takes the weights in the activations' dtype:
exact with fp32 x, rounded to bf16 with bf16 x (the kernel then sums as the plain
bf16 decode matmul does, so its result is, bit for bit, a bf16 engine's with the
dequantized weights). So a row's result does not depend on its batch beyond the
order of its fp32 sums, and a prefix recomputed after preemption matches its decode
(see the C file on why the activations are not quantized).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from kernels import cpu_kernels, f32_kernels
from kernels.cpu_features import cpu_vendor
from kernels.cpu_linear import packed_linear
from kernels.quant_layout import GROUP, KINDS, PAD, QUANT_KINDS, padded

log = logging.getLogger(__name__)

__all__ = ["KINDS", "QUANT_KINDS", "QuantizedWeight", "quant_linear", "quantize", "dequantize"]

CHUNK_ROWS = 4096
# Many-row matmuls dequantize slices of about this size (see quant_linear).
DEQUANT_TILE_BYTES = 4 << 20
# Above this many rows, dequantize and use oneDNN (see bench quant): bf16 rows, and fp32 ones.
MAX_KERNEL_ROWS = cpu_kernels.QUANT_MAX_ROWS
MAX_F32_KERNEL_ROWS = f32_kernels.MAX_ROWS


@dataclass
class QuantizedWeight:
    """One linear layer's weight [out_features, in_features], quantized."""

    kind: str
    data: torch.Tensor  # int8 or uint8 [out, in_pad], or uint8 nibbles [out, in_pad / 2]
    scale: torch.Tensor  # fp16 d [out, in_pad / 32], or (d, m) [out, in_pad / 32, 2]
    in_features: int

    @property
    def out_features(self) -> int:
        return self.data.shape[0]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.scale.nbytes

    def to(self, device: torch.device | str) -> QuantizedWeight:
        return QuantizedWeight(self.kind, self.data.to(device), self.scale.to(device),
                               self.in_features)


def _pad_columns(w: torch.Tensor) -> torch.Tensor:
    return F.pad(w, (0, padded(w.shape[1]) - w.shape[1]))


def quantize(weight: torch.Tensor, kind: str) -> QuantizedWeight:
    """Quantize a float weight [out, in]; the result lives on the weight's device."""
    if kind not in KINDS:
        raise ValueError(f"unknown weight kind {kind!r}; expected one of {KINDS}")
    if weight.dim() != 2 or not weight.is_floating_point() or weight.numel() == 0:
        raise ValueError(f"expected a non-empty 2-D float weight, got {tuple(weight.shape)}")
    if weight.shape[0] > CHUNK_ROWS:
        # Rows are quantized independently; in slices, the fp32 temporaries of a large
        # head (49152 rows) stay small.
        parts = [quantize(weight[i : i + CHUNK_ROWS], kind)
                 for i in range(0, weight.shape[0], CHUNK_ROWS)]
        return QuantizedWeight(kind, torch.cat([p.data for p in parts]),
                               torch.cat([p.scale for p in parts]), weight.shape[1])
    w = _pad_columns(weight.detach().float())
    out, in_pad = w.shape
    if kind == "bf16":
        return QuantizedWeight(kind, w.bfloat16().contiguous(),
                               torch.empty(out, 0, dtype=torch.float16, device=w.device),
                               weight.shape[1])
    groups = w.view(out, in_pad // GROUP, GROUP)
    if kind == "int8":
        d = (groups.abs().amax(dim=2, keepdim=True) / 127).half()
        q = (groups * _inverse(d)).round_().clamp_(-127, 127).to(torch.int8)
        return QuantizedWeight(kind, q.view(out, in_pad).contiguous(),
                               d.view(out, -1).contiguous(), weight.shape[1])
    m = groups.amin(dim=2, keepdim=True).half()
    d = ((groups.amax(dim=2, keepdim=True) - m.float()) / 15).half()
    scale = torch.cat((d, m), dim=2).contiguous()
    if kind == "uint8":
        levels = ((groups - m.float()) * _inverse(d.float() / 16)).round_().add_(8)
        levels = levels.clamp_(0, 255).to(torch.uint8)
        return QuantizedWeight(kind, levels.view(out, in_pad).contiguous(), scale, weight.shape[1])
    levels = ((groups - m.float()) * _inverse(d)).round_().clamp_(0, 15).to(torch.uint8)
    chunks = levels.view(out, in_pad // PAD, 2, GROUP)
    packed = chunks[:, :, 0] | (chunks[:, :, 1] << 4)
    return QuantizedWeight(kind, packed.reshape(out, in_pad // 2).contiguous(), scale,
                           weight.shape[1])


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """1 / d in fp32, 0 where d is 0 (a group of zeros quantizes to level 0)."""
    d = d.float()
    return torch.where(d > 0, 1 / d, torch.zeros_like(d))


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [out, in] in dtype, in torch: the reference the kernels are held to."""
    out = qw.out_features
    scale = qw.scale.float()
    if qw.kind == "bf16":
        return qw.data[:, : qw.in_features].to(dtype)
    if qw.kind == "int8":
        w = qw.data.view(out, -1, GROUP).float() * scale[:, :, None]
    else:
        step, offset = scale[:, :, :1], scale[:, :, 1:]
        if qw.kind == "uint8":
            # (q - 8) * step + m as q * step + (m - 8 * step): the product is exact, so
            # this is one rounding, as the C kernels' FMA, and where m - 8 * step is
            # exact (m and d within 2^13 of each other), the same one as the former.
            step = step / 16
            q, offset = qw.data.view(out, -1, GROUP).float(), offset - 8 * step
        else:
            low, high = qw.data & 0x0F, qw.data >> 4
            chunks = torch.stack((low.view(out, -1, GROUP), high.view(out, -1, GROUP)), dim=2)
            q = chunks.view(out, -1, GROUP).float()
        w = q * step + offset
    w = w.view(out, -1)
    return w[:, : qw.in_features].to(dtype)


def runs_kernel(x: torch.Tensor, qw: QuantizedWeight) -> bool:
    """True where a C kernel takes x: a few contiguous CPU rows, fp32 (the fp32 kernels,
    any kind) or bf16 (the AVX512-BF16 kernels, a quantized kind)."""
    if not (x.is_cpu and x.dim() == 2 and x.shape[0] > 0 and x.is_contiguous() and qw.data.is_cpu):
        return False
    if x.dtype == torch.float32:
        return x.shape[0] <= MAX_F32_KERNEL_ROWS and f32_kernels.available()
    if x.shape[0] > MAX_KERNEL_ROWS:
        return False
    return x.dtype == torch.bfloat16 and qw.kind != "bf16" and cpu_kernels.quant_available()


def kernel_matmul(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """x [a few rows, in] times the weight's transpose, in C; ValueError on bad input."""
    if x.dtype == torch.float32:
        return f32_kernels.linear(x, qw.kind, qw.data, qw.scale, qw.in_features)
    if x.dtype != torch.bfloat16:
        raise ValueError(f"expected bf16 or fp32 rows, got {x.dtype}")
    return cpu_kernels.quant_linear(x, qw.kind, qw.data, qw.scale, qw.in_features)


def dequantize_for_matmul(qw: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The weight in dtype: a C dequantizer where one runs, torch otherwise."""
    if qw.data.is_cpu and dtype == torch.float32 and f32_kernels.available():
        return f32_kernels.dequantize(qw.kind, qw.data, qw.scale, qw.in_features)
    if (qw.data.is_cpu and dtype == torch.bfloat16 and qw.kind != "bf16"
            and cpu_kernels.quant_available()):
        return cpu_kernels.dequantize(qw.kind, qw.data, qw.scale, qw.in_features, dtype)
    return dequantize(qw, dtype)


def quant_linear(
    x: torch.Tensor,
    qw: QuantizedWeight,
    bias: torch.Tensor | None = None,
    packed: torch.Tensor | None = None,
) -> torch.Tensor:
    """F.linear(x, W, bias) for a quantized W and x [..., in]. packed: W dequantized
    to x's dtype and laid out for oneDNN (kernels.cpu_linear.pack_weight), which the
    rows the kernel does not take multiply instead of dequantizing W on every call."""
    if x.shape[-1] != qw.in_features:
        raise ValueError(f"expected {qw.in_features} input features, got {x.shape[-1]}")
    if runs_kernel(x, qw):
        y = kernel_matmul(x, qw)
        return y if bias is None else y.add_(bias)
    if packed is not None:
        return packed_linear(x, packed, bias)
    return dequant_linear(x, qw, bias)


# Which GEMM multiplies many fp32 rows by a stored weight: "own" (kernels/csrc/f32/
# gemm.c, dequantizing as it goes) or "torch" (F.linear, MKL's sgemm, over tiles
# dequantized to memory). "auto" takes the own one on x86 CPUs not made by Intel:
# MKL keeps its fast kernels for Intel's, and on a Zen 4 the own one ran 1.1-1.2x
# MKL, on a Xeon an earlier form of it 0.85-0.93x (docs/benchmarks.md). ARM keeps
# torch's until measured there.
PREFILL_GEMM_ENV = "PREFIXCHAT_PREFILL_GEMM"
PREFILL_GEMMS = ("auto", "own", "torch")


@cache
def prefill_gemm() -> str:
    """The GEMM this process takes for many fp32 rows: "own" or "torch"."""
    wanted = os.environ.get(PREFILL_GEMM_ENV, "auto").strip().lower() or "auto"
    if wanted not in PREFILL_GEMMS:
        log.warning("%s=%s is not one of %s; taking auto", PREFILL_GEMM_ENV, wanted,
                    ", ".join(PREFILL_GEMMS))
        wanted = "auto"
    if wanted == "auto":
        wanted = "own" if cpu_vendor() not in ("", "GenuineIntel") else "torch"
    return "own" if wanted == "own" and f32_kernels.tiles_fast() else "torch"


def dequant_linear(
    x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The many-row path: the own GEMM over the stored weight (fp32 rows, where
    prefill_gemm takes it), else F.linear over the weight dequantized to x's dtype."""
    if (x.dtype == torch.float32 and x.is_cpu and qw.data.is_cpu and x.numel()
            and prefill_gemm() == "own"):
        rows = x.reshape(-1, qw.in_features).contiguous()
        y = f32_kernels.gemm(rows, qw.kind, qw.data, qw.scale, qw.in_features)
        y = y.view(*x.shape[:-1], qw.out_features)
        return y if bias is None else y.add_(bias)
    # Dequantize a slice of output rows at a time: the slice is still in cache when
    # oneDNN reads it, and a whole large weight (the head: 56 MB in bf16) would be a
    # fresh mapping, page-faulted in, on every call.
    tile = max(256, DEQUANT_TILE_BYTES // (qw.in_features * x.element_size()))
    if qw.out_features <= tile:
        return F.linear(x, dequantize_for_matmul(qw, x.dtype), bias)
    parts = []
    for o in range(0, qw.out_features, tile):
        part = QuantizedWeight(qw.kind, qw.data[o : o + tile], qw.scale[o : o + tile],
                               qw.in_features)
        parts.append(F.linear(x, dequantize_for_matmul(part, x.dtype),
                              None if bias is None else bias[o : o + tile]))
    return torch.cat(parts, dim=-1)
