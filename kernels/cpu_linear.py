"""Linear layers on CPU: weights packed once for oneDNN, and a few bf16 rows in C.

Eager F.linear in bf16 hands oneDNN a plain row-major weight, which it
re-lays out into its blocked (AMX/AVX512 tile) format on every call. Packing
each weight once at load time removes that work, for decode steps and
prefill-sized batches alike (measured: docs/benchmarks.md, "CPU kernels").
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from kernels import cpu_kernels
from kernels.cpu_features import cpu_path

log = logging.getLogger(__name__)


def can_pack(weight: torch.Tensor) -> bool:
    """Packing pays for bf16 weights on a CPU build with oneDNN, on the avx512-bf16
    path: elsewhere oneDNN refuses bf16 packing (it needs AVX512BW/VL/DQ or
    AVX-NE-CONVERT), and a forced lesser path behaves as such a CPU would."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and cpu_path() == "avx512-bf16"
    )


def pack_weight(weight: torch.Tensor, batch_hint: int | None = None) -> torch.Tensor | None:
    """The weight [out, in] in oneDNN's layout for about batch_hint rows, or None
    where this build can't pack it (the caller keeps the plain weight)."""
    if not can_pack(weight):
        return None
    try:
        if batch_hint:
            return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    except (RuntimeError, NotImplementedError) as exc:  # an odd build or CPU
        log.warning("oneDNN weight packing unavailable, using plain matmuls: %s", exc)
        return None


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [rows, in] times a packed weight; same result as F.linear up to rounding."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, except on CPU: up to 8 bf16 rows where the C kernels run take
    cpu_kernels.bf16_matmul (the C decode step's own matmul: exact products, fp32
    sums), and one other row is a matrix-vector product (torch.mv streams a bf16
    weight faster than F.linear's one-row matmul)."""
    if cpu_kernels.runs_bf16_matmul(x, weight):
        y = cpu_kernels.bf16_matmul(x, weight)
        return y if bias is None else y.add_(bias)
    if x.shape[0] == 1 and x.dim() == 2 and x.device.type == "cpu":
        y = torch.mv(weight, x[0]).unsqueeze(0)
        return y if bias is None else y.add_(bias)
    return F.linear(x, weight, bias)
