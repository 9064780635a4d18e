"""How a quantized weight's bits are stored: the kinds, the group and padding widths,
and each kind's tensors. The quantizer (kernels/quant_linear.py), the C binding
(kernels/cpu_kernels.py) and the engine's cache file all check tensors against this
one description; it imports neither of them."""

from __future__ import annotations

import torch

QUANT_KINDS = ("int8", "int4", "uint8")
# bf16 is a weight kept as bf16 for fp32 activations (widened to fp32 in registers):
# half the bytes of fp32 where bf16 is not native, with no scale.
KINDS = (*QUANT_KINDS, "bf16")
# Columns that share a scale (and, but for int8, an offset).
GROUP = 32
# Rows are padded with zeros to a multiple of this: the kernels' vector width.
PAD = 64


def padded(in_features: int) -> int:
    return -(-in_features // PAD) * PAD


def stored_layout(kind: str, out: int, in_features: int) -> dict[str, tuple[torch.dtype, tuple]]:
    """The dtype and shape of a weight's stored tensors ("data", "scale")."""
    in_pad = padded(in_features)
    if kind == "bf16":
        return {"data": (torch.bfloat16, (out, in_pad)), "scale": (torch.float16, (out, 0))}
    if kind == "int8":
        return {"data": (torch.int8, (out, in_pad)), "scale": (torch.float16, (out, in_pad // GROUP))}
    pairs = (torch.float16, (out, in_pad // GROUP, 2))
    if kind == "uint8":
        return {"data": (torch.uint8, (out, in_pad)), "scale": pairs}
    return {"data": (torch.uint8, (out, in_pad // 2)), "scale": pairs}


def check(kind: str, data: torch.Tensor, scale: torch.Tensor, in_features: int) -> int:
    """ValueError unless data and scale are a kind weight of in_features columns as
    stored_layout gives it; its padded width."""
    if kind not in KINDS:
        raise ValueError(f"unknown weight kind {kind!r}; expected one of {KINDS}")
    if data.dim() != 2 or in_features < 1:
        raise ValueError(f"a {kind} weight of {tuple(data.shape)} cannot have {in_features} columns")
    layout = stored_layout(kind, data.shape[0], in_features)
    (data_dtype, data_shape), (scale_dtype, scale_shape) = layout["data"], layout["scale"]
    if (data.dtype, scale.dtype) != (data_dtype, scale_dtype):
        raise ValueError(f"{kind} weights are {data_dtype} data with {scale_dtype} scales")
    if (tuple(data.shape), tuple(scale.shape)) != (data_shape, scale_shape):
        raise ValueError(f"a {kind} weight of {tuple(data.shape)} cannot have {in_features} columns")
    return padded(in_features)
