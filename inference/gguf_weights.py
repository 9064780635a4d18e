"""GGUF tensors on our quantized layouts (kernels/quant_layout.py).

A converted GGUF model's matmul weights hold the file's dequantized values in fp32;
quantizing those again (kernels.quant_linear.quantize) finds a group's grid from its
minimum and maximum, which is the file's own grid only where the group uses its
lowest and highest levels (Q4_1 and Q8_0 as llama.cpp writes them). Most other types
leave some groups short of one end (Q4_0 and Q5_0 reach level 0 only, a k-quant
sub-block rarely spans its 4 or 5 bits), and re-quantizing moves their weights by up
to half a step. So the quantizer takes each row from the file's own blocks where the
weight dtype can hold them:

| GGUF type | as              | our kind | exact? |
| --------- | --------------- | -------- | ------ |
| Q8_0      | q * d           | int8     | yes |
| Q8_0      | (q + k) * d - k * d | uint8 | yes where k = 64 or 128 fits the group's levels, else k = 120 and k * d rounds to fp16 |
| Q4_0      | q * d - 8 d     | int4, uint8 | yes |
| Q4_1      | q * d + m       | int4, uint8 | yes |
| Q5_0      | q * d - 16 d    | uint8    | yes |
| Q5_1      | q * d + m       | uint8    | yes |
| Q4_K      | q * (d sc) - dmin m | int4, uint8 | d sc and dmin m round to fp16 |
| Q5_K      | q * (d sc) - dmin m | uint8 | d sc and dmin m round to fp16 |

("yes" for uint8 also needs m - 8 d exact in fp32, as kernels.quant_linear says: it
is wherever m and d lie within 2^13 of each other.) A k-quant sub-block of 32 is an
affine 4- or 5-bit grid, but its step d * sc (an fp16 times a 6-bit integer: up to 17
significant bits) and offset dmin * m rarely fit fp16's 11, so each is rounded to
fp16: a weight at level q moves by at most q * ulp(step) / 2 + ulp(offset) / 2, about
2^-11 of its group's range (`rounding_bound`), where bf16 would move it by 2^-8 of the
weight and re-quantizing by up to half a step. Q6_K (sub-blocks of 16, signed 8-bit
scales: two scales in one of our groups of 32) and the other types fit none of our
grids; their rows keep the re-quantized copy.

Which rows come from which tensor is found by content, not by name: a model class may
fuse q/k/v or gate/up, and transformers permutes Llama's q/k rows, but every row of a
layer equals, bit for bit, one dequantized row of the file. A 64-bit hash of each
row's bits finds it, and the row's native copy is checked against the layer's values
within the bound above before it replaces the re-quantized one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import Q4_K, dequantize

from inference.gguf_file import GGUFFile
from kernels.quant_layout import GROUP, PAD, padded
from kernels.quant_linear import QuantizedWeight
from kernels.quant_linear import dequantize as dequantize_ours

log = logging.getLogger(__name__)

T = GGMLQuantizationType
# The kinds (kernels.quant_layout) whose grid holds each type's rows.
NATIVE_KINDS: dict[GGMLQuantizationType, tuple[str, ...]] = {
    T.Q8_0: ("int8", "uint8"),
    T.Q4_0: ("int4", "uint8"),
    T.Q4_1: ("int4", "uint8"),
    T.Q5_0: ("uint8",),
    T.Q5_1: ("uint8",),
    T.Q4_K: ("int4", "uint8"),
    T.Q5_K: ("uint8",),
}
# Types whose rows our kinds hold bit for bit (k-quants round their scales to fp16).
EXACT_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)
# fp16's unit roundoff and half its smallest subnormal step.
FP16_ROUNDOFF = 2.0**-11
FP16_HALF_TINY = 2.0**-25
# Rows at a time where a whole tensor's temporaries would be large (a 262k-row embedding).
CHUNK_ROWS = 8192
# The file beside a converted model that names the GGUF it came from.
SOURCE_RECORD = "gguf_source.json"


@dataclass
class AffineRows:
    """A tensor's rows as w = q * step + offset, one step and offset per 32 columns;
    exact in real arithmetic (step and offset are exact fp32 values)."""

    q: np.ndarray  # int16 [rows, cols]
    step: np.ndarray  # float32 [rows, cols / 32]
    offset: np.ndarray  # float32 [rows, cols / 32]
    signed: bool  # q is symmetric about 0 (Q8_0), else q >= 0

    def values(self) -> np.ndarray:
        """w in fp32, each rounded once from its exact value (as gguf's dequantizers)."""
        rows, cols = self.q.shape
        q = self.q.reshape(rows, -1, GROUP).astype(np.float64)
        w = q * self.step[..., None].astype(np.float64) + self.offset[..., None].astype(np.float64)
        return w.reshape(rows, cols).astype(np.float32)


def _fp16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """[n, bytes] -> [n, 2 * bytes]: each `chunk` bytes give `chunk` low nibbles, then
    `chunk` high ones (the order of every GGUF 4-bit type)."""
    n = qs.shape[0]
    parts = qs.reshape(n, -1, 1, chunk) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (parts & np.uint8(0x0F)).reshape(n, -1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Q5_0/Q5_1: bit j of a block's 32-bit qh is element j's fifth bit."""
    bits = qh.view("<u4").reshape(-1, 1) >> np.arange(count, dtype=np.uint32).reshape(1, count)
    return (bits & np.uint32(1)).astype(np.uint8)


def affine_rows(raw: np.ndarray, qtype: GGMLQuantizationType, cols: int) -> AffineRows | None:
    """A quantized tensor's bytes [rows, row_bytes] as AffineRows; None for a type
    without such a form (Q6_K, Q2_K, Q3_K, IQ*, ...)."""
    if qtype not in NATIVE_KINDS:
        return None
    rows = raw.shape[0]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = np.ascontiguousarray(raw).reshape(-1, type_size)
    n = blocks.shape[0]
    per_block = block_size // GROUP
    signed = False
    if qtype == T.Q8_0:
        d = _fp16(blocks[:, 0:2])
        q = blocks[:, 2:].view(np.int8).astype(np.int16)
        step, offset, signed = d, np.zeros_like(d), True
    elif qtype in (T.Q4_0, T.Q4_1):
        d = _fp16(blocks[:, 0:2])
        start = 2 if qtype == T.Q4_0 else 4
        q = _nibbles(blocks[:, start:], 16).astype(np.int16)
        step, offset = d, (-8 * d if qtype == T.Q4_0 else _fp16(blocks[:, 2:4]))
    elif qtype in (T.Q5_0, T.Q5_1):
        d = _fp16(blocks[:, 0:2])
        start = 2 if qtype == T.Q5_0 else 4
        high = _high_bits(blocks[:, start : start + 4].copy(), 32)
        q = (_nibbles(blocks[:, start + 4 :], 16) | (high << 4)).astype(np.int16)
        step, offset = d, (-16 * d if qtype == T.Q5_0 else _fp16(blocks[:, 2:4]))
    elif qtype in (T.Q4_K, T.Q5_K):
        d, dmin = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
        sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())
        # Both products are exact in fp32 (11 + 6 significant bits).
        step = d[:, None] * sc.astype(np.float32)
        offset = -(dmin[:, None] * m.astype(np.float32))
        if qtype == T.Q4_K:
            q = _nibbles(blocks[:, 16:], 32).astype(np.int16)
        else:
            qh = blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            high = (qh & np.uint8(1)).reshape(n, -1)
            q = (_nibbles(blocks[:, 48:], 32) | (high << 4)).astype(np.int16)
    else:
        return None
    step = np.asarray(step, dtype=np.float32).reshape(n * per_block)
    offset = np.asarray(offset, dtype=np.float32).reshape(n * per_block)
    return AffineRows(q.reshape(rows, cols), step.reshape(rows, -1), offset.reshape(rows, -1),
                      signed)


def to_kind(rows: AffineRows, kind: str) -> QuantizedWeight | None:
    """The rows in kind's layout, or None where its grid cannot take them (levels out
    of range, an offset int8 lacks, a scale past fp16's range)."""
    q, step, offset = rows.q, rows.step, rows.offset
    out, cols = q.shape
    groups = q.reshape(out, -1, GROUP)
    if kind == "int8":
        if not rows.signed or (offset != 0).any() or groups.min() < -127 or groups.max() > 127:
            return None
        data, scale = q.astype(np.int8), step.astype(np.float16)
    elif kind == "int4":
        if rows.signed or groups.min() < 0 or groups.max() > 15:
            return None
        data = q.astype(np.uint8)
        scale = np.stack((step, offset), axis=-1).astype(np.float16)
    elif kind == "uint8":
        # (q' - 8) * D / 16 + m with q' = mu * (q + k) + 8, D = 16 * step / mu and
        # m = offset - k * step. 4-bit levels take mu = 16, int4's grid with each step
        # cut in 16 as quantize() lays a Q4_1 group out (the same bytes); wider ones
        # mu = 1. Q8_0's symmetric levels need k: k * step is exact in fp16 for k a
        # power of 2, so one is taken where the group's levels fit.
        if rows.signed:
            lo, hi = groups.min(axis=2), groups.max(axis=2)
            k = np.where(hi <= 119, 128, np.where(lo >= -72, 64, 120)).astype(np.float32)
        else:
            k = np.zeros(step.shape, dtype=np.float32)
        mu = 16 if not rows.signed and groups.max() <= 15 else 1
        levels = mu * (groups + k[..., None].astype(np.int16)) + 8
        if levels.min() < 0 or levels.max() > 255:
            return None
        data = levels.reshape(out, cols).astype(np.uint8)
        m = offset.astype(np.float64) - k.astype(np.float64) * step.astype(np.float64)
        scale = np.stack((16 / mu * step.astype(np.float64), m), axis=-1).astype(np.float16)
    else:
        return None
    if not np.isfinite(scale).all():
        return None
    return _padded(kind, torch.from_numpy(data), torch.from_numpy(scale), cols)


def _padded(kind: str, data: torch.Tensor, scale: torch.Tensor, cols: int) -> QuantizedWeight:
    """Our stored layout: rows padded with zero groups to a multiple of 64 columns, int4's
    nibbles packed as kernels.quant_linear.quantize packs them."""
    out, in_pad = data.shape[0], padded(cols)
    data = torch.nn.functional.pad(data, (0, in_pad - cols))
    pad_groups = (in_pad - cols) // GROUP
    scale = torch.nn.functional.pad(scale, (0, 0, 0, pad_groups) if scale.dim() == 3
                                    else (0, pad_groups))
    if kind == "int4":
        chunks = data.view(out, in_pad // PAD, 2, GROUP)
        data = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(out, in_pad // 2)
    return QuantizedWeight(kind, data.contiguous(), scale.contiguous(), cols)


def rounding_bound(qw: QuantizedWeight) -> torch.Tensor:
    """How far a row of qw may lie from the values it was built from, per element
    [out, in]: half an fp16 step of its scale times its level plus half one of its
    offset (the k-quants' rounding), and an fp32 rounding of the result."""
    out, cols = qw.out_features, qw.in_features
    if qw.kind == "bf16":
        raise ValueError("bf16 weights have no scales")
    scale = qw.scale.float().abs()
    if qw.kind == "int8":
        level = qw.data.view(out, -1, GROUP).float().abs()
        step, off = scale[:, :, None], torch.zeros_like(scale)[:, :, None]
    else:
        step, off = scale[:, :, :1], scale[:, :, 1:]
        if qw.kind == "uint8":
            step = step / 16
            level = (qw.data.view(out, -1, GROUP).float() - 8).abs()
        else:
            packed = qw.data.view(out, -1, GROUP)
            low, high = packed & 0x0F, packed >> 4
            level = torch.stack((low, high), dim=2).view(out, -1, GROUP).float()
    err = FP16_ROUNDOFF * (level * step + off) + FP16_HALF_TINY * (level + 1)
    value = level * step + off
    err = err + 2.0**-23 * value
    return err.view(out, -1)[:, :cols]


# 64-bit hashes of rows' fp32 bits: integer sums wrap the same whatever their order.
_HASH_KEYS: dict[int, np.ndarray] = {}


def row_hashes(values: np.ndarray) -> np.ndarray:
    """uint64 [rows] from fp32 [rows, cols]: sum of bits * a fixed random key, mod 2^64."""
    cols = values.shape[1]
    if cols not in _HASH_KEYS:
        rng = np.random.default_rng(cols)
        _HASH_KEYS[cols] = rng.integers(1, 2**63, size=cols, dtype=np.uint64) | np.uint64(1)
    out = np.empty(values.shape[0], dtype=np.uint64)
    for i in range(0, values.shape[0], CHUNK_ROWS):  # small uint64 temporaries
        part = np.ascontiguousarray(values[i : i + CHUNK_ROWS], dtype=np.float32)
        bits = part.view(np.uint32).astype(np.uint64)
        with np.errstate(over="ignore"):
            out[i : i + CHUNK_ROWS] = (bits * _HASH_KEYS[cols]).sum(axis=1, dtype=np.uint64)
    return out


def dequantize_tensor(tensor, rows: slice = slice(None)) -> np.ndarray:
    """A GGUF reader tensor (or some of its rows) as fp32 [rows, cols] (numpy order:
    GGUF's shape reversed), by the gguf package's own dequantizers."""
    values = np.asarray(dequantize(np.asarray(tensor.data)[rows], tensor.tensor_type),
                        dtype=np.float32)
    if not values.flags.writeable:  # F32 comes back as the file's read-only mapping
        values = values.copy()
    return values.reshape(-1, int(tensor.shape[0]))


def _tensor_hashes(tensor) -> np.ndarray:
    n = int(np.asarray(tensor.data).shape[0])
    return np.concatenate([row_hashes(dequantize_tensor(tensor, slice(i, i + CHUNK_ROWS)))
                           for i in range(0, n, CHUNK_ROWS)])


class NativeSource:
    """A GGUF file's matmul tensors, ready to replace re-quantized rows with the file's
    own (see the module's docstring)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.tensors = [t for t in GGUFFile(self.path).tensors if len(t.shape) == 2]
        self._pools: dict[int, _Pool] = {}
        self._native: dict[tuple[str, str], QuantizedWeight | None] = {}

    def _pool(self, cols: int, max_rows: int) -> _Pool:
        """The hashed rows of every tensor of `cols` columns and at most max_rows rows
        (a layer holds no row of a larger tensor: a 1536-row q/k/v needs no hashes of a
        262k-row embedding). Grows as larger layers ask."""
        pool = self._pools.setdefault(cols, _Pool([], np.zeros(0, np.uint64),
                                                  np.zeros((0, 2), np.int64)))
        new = [t for t in self.tensors if int(t.shape[0]) == cols
               and int(np.prod(t.shape[1:])) <= max_rows and t not in pool.tensors]
        if new:
            hashes, index = [pool.hashes], [pool.index]
            for t in new:
                h = _tensor_hashes(t)
                pool.tensors.append(t)
                hashes.append(h)
                index.append(np.stack((np.full(len(h), len(pool.tensors) - 1), np.arange(len(h))), 1))
            all_h, all_i = np.concatenate(hashes), np.concatenate(index)
            order = np.argsort(all_h, kind="stable")
            pool.hashes, pool.index = all_h[order], all_i[order]
        return pool

    def native(self, tensor, kind: str) -> QuantizedWeight | None:
        key = (tensor.name, kind)
        if key not in self._native:
            qw = None
            if kind in NATIVE_KINDS.get(tensor.tensor_type, ()):
                rows = affine_rows(np.asarray(tensor.data), tensor.tensor_type, int(tensor.shape[0]))
                qw = None if rows is None else to_kind(rows, kind)
            self._native[key] = qw
        return self._native[key]

    def overlay(self, qw: QuantizedWeight, weight: torch.Tensor) -> int:
        """Replace, in place, each row of qw (the re-quantized `weight`) that the file
        holds natively for qw's kind; the number of rows on the file's values: those
        replaced, or all where re-quantizing already gave them back exactly."""
        if qw.kind not in ("int8", "int4", "uint8") or weight.dtype != torch.float32:
            return 0
        if torch.equal(dequantize_ours(qw, torch.float32), weight.detach().cpu()):
            # Already the file's values (Q4_1, Q8_0 as llama.cpp writes them).
            return qw.out_features
        values = weight.detach().cpu().numpy()
        pool = self._pool(values.shape[1], values.shape[0])
        if len(pool.hashes) == 0:
            return 0
        h = row_hashes(values)
        pos = np.searchsorted(pool.hashes, h).clip(0, len(pool.hashes) - 1)
        found = pool.hashes[pos] == h
        replaced = 0
        src = pool.index[pos]
        for ti in np.unique(src[found, 0]):
            tensor = pool.tensors[ti]
            native = self.native(tensor, qw.kind)
            if native is None:
                continue
            matched = np.nonzero(found & (src[:, 0] == ti))[0]
            for i in range(0, len(matched), CHUNK_ROWS):
                rows = matched[i : i + CHUNK_ROWS]
                their = torch.from_numpy(src[rows, 1])
                ours = torch.from_numpy(rows)
                cand = QuantizedWeight(qw.kind, native.data[their], native.scale[their],
                                       qw.in_features)
                got = dequantize_ours(cand, torch.float32)
                want = weight.detach()[ours.to(weight.device)].cpu()
                if not (torch.equal(got, want)
                        or bool(((got - want).abs() <= rounding_bound(cand)).all())):
                    log.warning("%s: rows that hash as %s's differ from it; re-quantized",
                                self.path.name, tensor.name)
                    continue
                qw.data[ours.to(qw.data.device)] = cand.data.to(qw.data.device)
                qw.scale[ours.to(qw.scale.device)] = cand.scale.to(qw.scale.device)
                replaced += len(rows)
        return replaced


@dataclass
class _Pool:
    tensors: list
    hashes: np.ndarray  # uint64, sorted
    index: np.ndarray  # [n, 2]: (tensor, row) of each hash


def write_source_record(folder: Path, gguf: Path) -> None:
    """Name the GGUF a converted folder came from, for native_source."""
    st = gguf.stat()
    record = {"path": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    (folder / SOURCE_RECORD).write_text(json.dumps(record))


def recorded_source(folder: str | Path | None) -> Path | None:
    """The GGUF a converted folder came from, where it is still there unchanged."""
    if not folder:
        return None
    try:
        record = json.loads((Path(folder) / SOURCE_RECORD).read_text())
        path = Path(record["path"])
        st = path.stat()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (st.st_size, st.st_mtime_ns) != (record.get("size"), record.get("mtime_ns")):
        log.info("%s changed since its conversion: its weights are re-quantized", path)
        return None
    return path


def native_source(folder: str | Path | None) -> NativeSource | None:
    """A NativeSource on the GGUF a converted folder came from (recorded_source)."""
    path = recorded_source(folder)
    return None if path is None else NativeSource(path)


def tensor_types(path: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """Each tensor's GGUF type name (all tensors, or those named)."""
    wanted = None if names is None else set(names)
    return {t.name: t.tensor_type.name for t in GGUFFile(path).tensors
            if wanted is None or t.name in wanted}
