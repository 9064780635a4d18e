"""GGUF tensors on our quantized layouts (kernels/quant_layout.py).

The engine takes a GGUF file's matmul weights from its blocks, one tensor at a time
(inference/gguf_checkpoint.py reads them), onto the kind that holds them:

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
grids; their values are quantized again, onto 8 bits with an offset (uint8) where
they have more than 4 bits a weight (`stored_weight`).

Re-quantizing dequantized values instead would find a group's grid from its minimum
and maximum, the file's own grid only where the group uses its lowest and highest
levels (Q4_1 and Q8_0 as llama.cpp writes them): Q4_0 and Q5_0 reach level 0 only and a
k-quant sub-block rarely spans its 4 or 5 bits, so their weights would move by up to
half a step.
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
from kernels import block_convert
from kernels.quant_layout import GROUP, PAD, padded, stored_layout
from kernels.quant_linear import QuantizedWeight, quantize

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


# The kinds a layer may take its blocks in, best first, by the kind its weight dtype
# gives it (inference.quantize.layer_kind): Q8_0 blocks go to int8 (exact), an int4
# layer's 5-bit blocks to the 8-bit grid with an offset rather than losing their bits.
KIND_ORDER = {"int4": ("int4", "int8", "uint8"), "uint8": ("int8", "uint8"),
              "int8": ("int8", "uint8")}
# Types of at most 4 bits a weight: re-quantized (no kind holds their blocks) they take
# the layer's own kind; wider ones (Q6_K, F16, ...) take 8 bits with an offset.
NARROW_TYPES = (T.Q4_0, T.Q4_1, T.Q4_K, T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS)


def same_bytes(raw: np.ndarray, qtype: GGMLQuantizationType, kind: str,
               cols: int) -> QuantizedWeight | None:
    """Where kind stores a type's levels in the file's own byte order, its rows without
    unpacking them: Q8_0's bytes are int8's, and a Q4_K super-block's 128 bytes of
    nibbles are int4's packing of its 256 columns (column j of each 64 in the low
    nibble of byte j, column 32 + j in the high one). to_kind(affine_rows(...)) gives
    the same tensors, a few times slower; None for the other pairs."""
    rows = raw.shape[0]
    if qtype == T.Q8_0 and kind == "int8":
        blocks = np.ascontiguousarray(raw).reshape(-1, 34)
        data = blocks[:, 2:].view(np.int8)
        if (data == -128).any():  # off int8's grid (llama.cpp never writes it)
            return None
        scale = blocks[:, :2].view(np.float16).reshape(rows, -1)
        data = data.reshape(rows, cols)
    elif qtype == T.Q4_K and kind == "int4":
        blocks = np.ascontiguousarray(raw).reshape(-1, 144)
        d, dmin = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
        sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())
        step = (d[:, None] * sc.astype(np.float32)).astype(np.float16)
        offset = (-(dmin[:, None] * m.astype(np.float32))).astype(np.float16)
        scale = np.stack((step, offset), axis=-1).reshape(rows, -1, 2)
        if not np.isfinite(scale).all():
            return None
        data = blocks[:, 16:].reshape(rows, cols // 2)
    else:
        return None
    if padded(cols) != cols:
        return None
    return QuantizedWeight(kind, torch.from_numpy(np.ascontiguousarray(data)),
                           torch.from_numpy(np.ascontiguousarray(scale)), cols)


class _Rows:
    """A layer's stored tensors, laid out once (kernels.quant_layout) and filled a chunk
    of a part at a time: each chunk is copied once, to its rows in transformers' order."""

    def __init__(self, kind: str, rows: int, cols: int):
        layout = stored_layout(kind, rows, cols)
        self.kind, self.cols = kind, cols
        self.data = torch.empty(layout["data"][1], dtype=layout["data"][0])
        self.scale = torch.empty(layout["scale"][1], dtype=layout["scale"][0])

    def put(self, chunk: QuantizedWeight, start: int, rows: np.ndarray | None) -> None:
        """chunk's rows at start (and on), or at the rows given."""
        if rows is None:
            self.data[start : start + chunk.out_features].copy_(chunk.data)
            self.scale[start : start + chunk.out_features].copy_(chunk.scale)
        else:
            index = torch.from_numpy(rows)
            self.data.index_copy_(0, index, chunk.data)
            self.scale.index_copy_(0, index, chunk.scale)

    def weight(self) -> QuantizedWeight:
        return QuantizedWeight(self.kind, self.data, self.scale, self.cols)


def _chunks(part, out: _Rows, offset: int, convert) -> bool:
    """Fill part's rows of out (from offset) with convert(raw rows) a chunk at a time;
    False, leaving out half filled, where convert gives None."""
    inverse = None if part.perm is None else np.argsort(part.perm)
    for i in range(0, part.rows, CHUNK_ROWS):
        qw = convert(part.raw(i, i + CHUNK_ROWS), i)
        if qw is None:
            return False
        rows = None if inverse is None else offset + inverse[i : i + qw.out_features]
        out.put(qw, offset + i, rows)
    return True


def _native_part(part, out: _Rows, offset: int) -> bool:
    """part's rows on out's grid from its blocks, or False where it cannot hold them."""
    kind = out.kind
    if kind not in NATIVE_KINDS.get(part.qtype, ()):
        return False

    def convert(raw: np.ndarray, _start: int) -> QuantizedWeight | None:
        qw = same_bytes(raw, part.qtype, kind, part.cols)
        if qw is not None:
            return qw
        rows = affine_rows(raw, part.qtype, part.cols)
        return None if rows is None else to_kind(rows, kind)

    return _chunks(part, out, offset, convert)


def _requantized_part(part, out: _Rows, offset: int) -> None:
    """part's rows quantized again onto out's grid from the file's values."""

    def convert(raw: np.ndarray, start: int) -> QuantizedWeight:
        if part.qtype == T.Q6_K and out.kind == "uint8":  # in one C pass, the same bytes
            qw = block_convert.q6k_to_uint8(raw, part.cols)
            if qw is not None:
                return qw
        return quantize(torch.from_numpy(part.values(start, start + len(raw))), out.kind)

    _chunks(part, out, offset, convert)


def stored_weight(parts: list, kind: str) -> tuple[QuantizedWeight, int]:
    """A layer's weight from the file tensors that make it (q, k and v, or gate and up,
    stacked by rows; inference.gguf_checkpoint.FileTensor), and how many of its rows
    hold the file's blocks: all, on the first kind of KIND_ORDER[kind] whose grid holds
    every part; else each part on one kind, from its blocks where that kind holds them
    and quantized again from its values where not (Q6_K): uint8 where a part has more
    than 4 bits a weight, so none loses bits (the head too), else kind. A chunk of a
    part at a time: nothing of the model is dequantized but a re-quantized chunk."""
    total, cols = sum(p.rows for p in parts), parts[0].cols
    for candidate in KIND_ORDER.get(kind, (kind,)):
        out, offset = _Rows(candidate, total, cols), 0
        for part in parts:
            if not _native_part(part, out, offset):
                break
            offset += part.rows
        else:
            return out.weight(), total
    target = "uint8" if any(p.qtype not in NARROW_TYPES for p in parts) else kind
    out, offset, native = _Rows(target, total, cols), 0, 0
    for part in parts:
        if _native_part(part, out, offset):
            native += part.rows
        else:
            _requantized_part(part, out, offset)
        offset += part.rows
    return out.weight(), native


def dequantize_tensor(tensor, rows: slice = slice(None)) -> np.ndarray:
    """A GGUF reader tensor (or some of its rows) as fp32 [rows, cols] (numpy order:
    GGUF's shape reversed), by the gguf package's own dequantizers."""
    values = np.asarray(dequantize(np.asarray(tensor.data)[rows], tensor.tensor_type),
                        dtype=np.float32)
    if not values.flags.writeable:  # F32 comes back as the file's read-only mapping
        values = values.copy()
    return values.reshape(-1, int(tensor.shape[0]))


def write_source_record(folder: Path, gguf: Path) -> None:
    """Name the GGUF file a model folder describes (inference.loader), so its weights
    are read from it."""
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


def tensor_types(path: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """Each tensor's GGUF type name (all tensors, or those named)."""
    wanted = None if names is None else set(names)
    return {t.name: t.tensor_type.name for t in GGUFFile(path).tensors
            if wanted is None or t.name in wanted}
