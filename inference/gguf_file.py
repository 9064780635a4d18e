"""A GGUF file's metadata and tensors, read without parsing its vocabulary.

gguf.GGUFReader builds a numpy view for every element of every metadata array: seconds
for SmolLM2's 49k-token vocabulary and tens of seconds for Gemma 3's 262k, on every
engine start that asks a file its tensor types. This reads the header, steps over the
arrays, and maps each tensor's bytes from the file (the layout of the GGUF spec,
little-endian, versions 2 and 3).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# Value types of the spec: struct formats of the fixed-size ones.
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


class GGUFFormatError(ValueError):
    pass


@dataclass
class Tensor:
    """One tensor: shape in GGUF's order (columns first), data as numpy gives it in
    gguf.GGUFReader (rows of bytes for a quantized type, values otherwise)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    _file: GGUFFile
    _offset: int

    @cached_property
    def data(self) -> np.ndarray:
        block, size = GGML_QUANT_SIZES[self.tensor_type]
        dims = tuple(reversed(self.shape))  # numpy order: rows first
        if self.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16,
                                GGMLQuantizationType.F64):
            dtype = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                     GGMLQuantizationType.F64: np.float64}[self.tensor_type]
            count = int(np.prod(dims))
            return self._file.map(self._offset, dtype, count).reshape(dims)
        if dims[-1] % block:
            raise GGUFFormatError(f"{self.name}: {dims[-1]} columns are not whole blocks")
        row_bytes = dims[-1] // block * size
        rows = int(np.prod(dims[:-1])) if len(dims) > 1 else 1
        raw = self._file.map(self._offset, np.uint8, rows * row_bytes)
        return raw.reshape(*dims[:-1], row_bytes)


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.metadata: dict[str, object] = {}
        self.tensors: list[Tensor] = []
        with open(self.path, "rb") as f:
            if self.path.stat().st_size < 24:
                raise GGUFFormatError(f"{self.path} is not a GGUF file")
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._read(self._mmap)

    def _read(self, buf) -> None:
        if buf[:4] != b"GGUF":
            raise GGUFFormatError(f"{self.path} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise GGUFFormatError(f"{self.path}: GGUF version {version} is not read here")
        pos = 24
        try:
            for _ in range(n_kv):
                key, pos = self._string(buf, pos)
                (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
                value, pos = self._value(buf, pos, vtype)
                self.metadata[key] = value
            infos = []
            for _ in range(n_tensors):
                name, pos = self._string(buf, pos)
                (n_dims,) = struct.unpack_from("<I", buf, pos)
                shape = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
                ttype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
                pos += 4 + 8 * n_dims + 12
                infos.append((name, GGMLQuantizationType(ttype), tuple(shape), offset))
        except struct.error as exc:
            raise GGUFFormatError(f"{self.path}: its header runs past {len(buf)} bytes") from exc
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-pos // align) * align
        self.tensors = [Tensor(n, t, s, self, data_start + o) for n, t, s, o in infos]

    @staticmethod
    def _string(buf, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", buf, pos)
        end = pos + 8 + n
        if end > len(buf):
            raise struct.error("string past the end")
        return buf[pos + 8 : end].decode("utf-8", errors="replace"), end

    def _value(self, buf, pos: int, vtype: int) -> tuple[object, int]:
        if vtype in _FIXED:
            fmt = "<" + _FIXED[vtype]
            return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
        if vtype == _STRING:
            return self._string(buf, pos)
        if vtype == _ARRAY:
            itype, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if itype in _FIXED:  # skipped: only its length is kept
                return ("array", count), pos + count * struct.calcsize(_FIXED[itype])
            for _ in range(count):
                _, pos = self._value(buf, pos, itype)
            return ("array", count), pos
        raise GGUFFormatError(f"{self.path}: unknown metadata type {vtype}")

    def map(self, offset: int, dtype, count: int) -> np.ndarray:
        """count values of dtype at offset, read-only, from the file's mapping."""
        if offset + count * np.dtype(dtype).itemsize > len(self._mmap):
            raise GGUFFormatError(f"{self.path}: a tensor runs past the end of the file")
        return np.frombuffer(self._mmap, dtype=dtype, count=count, offset=offset)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None
