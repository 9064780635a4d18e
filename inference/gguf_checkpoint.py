"""A GGUF file as the engine's checkpoint, under transformers' weight names.

The engine reads a GGUF file one tensor at a time, as it is: a matmul weight's blocks
go onto our layouts (inference/gguf_weights.py) without an fp32 copy of the model in
memory or on disk; the small tensors (norms, biases) are dequantized by the gguf
package's own dequantizers. Tensors are read with pread rather than through the file's
mapping, so a tensor's pages are not left resident once its rows are taken.

The file's names are transformers' through the gguf package's own name map, and what
llama.cpp's converter changed is undone by transformers' own tensor processors (Llama's
q/k rows permuted for its RoPE, Gemma's norms stored as 1 + w), so this reads a file as
transformers would, without dequantizing it whole.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, MODEL_ARCH_NAMES, GGMLQuantizationType, get_tensor_name_map
from gguf.quants import dequantize
from torch import nn

from inference.gguf_file import GGUFFile, GGUFFormatError, Tensor
from inference.models.registry import text_config

T = GGMLQuantizationType
_ARCH_IDS = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}


def _processor(arch: str, config):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    cls = TENSOR_PROCESSORS.get(arch, TensorProcessor)
    return cls(config={"num_attention_heads": config.num_attention_heads,
                       "num_key_value_heads": config.num_key_value_heads})


class FileTensor:
    """One tensor of the file: its type, its shape as [rows, cols] (numpy's order) and
    its bytes, read on demand."""

    def __init__(self, tensor: Tensor, fd: int, perm: np.ndarray | None):
        self.name = tensor.name
        self.qtype = tensor.tensor_type
        self.cols = int(tensor.shape[0])
        self.rows = int(np.prod(tensor.shape[1:])) if len(tensor.shape) > 1 else 1
        block, size = GGML_QUANT_SIZES[self.qtype]
        if self.cols % block:
            raise GGUFFormatError(f"{self.name}: {self.cols} columns are not whole blocks")
        self.row_bytes = self.cols // block * size
        self._offset = tensor._offset
        self._fd = fd
        # Rows in transformers' order: row i of the weight is the file's row perm[i].
        self.perm = perm

    def raw(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The file's rows [start, stop) as bytes [n, row_bytes], in the file's order."""
        stop = self.rows if stop is None else min(stop, self.rows)
        out = np.empty((stop - start, self.row_bytes), dtype=np.uint8)
        view, pos, done = memoryview(out).cast("B"), self._offset + start * self.row_bytes, 0
        while done < out.nbytes:
            n = os.preadv(self._fd, [view[done:]], pos + done)
            if n <= 0:
                raise GGUFFormatError(f"{self.name} runs past the end of the file")
            done += n
        return out

    def values(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of the file, dequantized to fp32 by the gguf package."""
        raw = self.raw(start, stop)
        if self.qtype == T.F32:
            return raw.view(np.float32).reshape(len(raw), self.cols)
        out = dequantize(raw, self.qtype)
        return np.asarray(out, dtype=np.float32).reshape(len(raw), self.cols)


class GGUFCheckpoint:
    """transformers' weight names -> fp32 tensors, for a model config read from the
    same file. Reading a name dequantizes that tensor alone; `tensor(name)` gives the
    file's tensor for a matmul weight's blocks."""

    def __init__(self, path: str | Path, config):
        self.path = Path(path)
        self.file = GGUFFile(self.path)
        self.arch = self.file.architecture or ""
        if self.arch not in _ARCH_IDS:
            raise GGUFFormatError(f"{self.path.name}: architecture {self.arch!r} has no "
                                  "tensor names in the gguf package")
        self.config = text_config(config)
        self._by_name = {t.name: t for t in self.file.tensors}
        self._names = get_tensor_name_map(_ARCH_IDS[self.arch], self.config.num_hidden_layers)
        self._processor = _processor(self.arch, self.config)
        self._fd = os.open(self.path, os.O_RDONLY)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    @property
    def file_bytes(self) -> int:
        return self.path.stat().st_size

    def gguf_name(self, hf_name: str) -> str | None:
        """The file's tensor name for a transformers weight name, where it has one."""
        stem, _, suffix = hf_name.rpartition(".")
        if suffix not in ("weight", "bias"):
            return None
        name = self._names.get_name(stem)
        if name is None:
            return None
        name = f"{name}.{suffix}"
        return name if name in self._by_name else None

    def tensor(self, hf_name: str) -> FileTensor:
        name = self.gguf_name(hf_name)
        if name is None:
            raise KeyError(f"weight {hf_name} missing from {self.path.name}")
        t = self._by_name[name]
        return FileTensor(t, self._fd, self._permutation(name, t))

    def _permutation(self, name: str, t: Tensor) -> np.ndarray | None:
        """Where the file's rows are transformers' rows permuted (Llama's q and k), the
        permutation, found by processing the row numbers as a one-column weight."""
        if len(t.shape) != 2:
            return None
        rows = int(t.shape[1])
        index = np.arange(rows, dtype=np.float64).reshape(rows, 1)
        out = np.asarray(self._processor.process(weights=index, name=name).weights)
        if out.shape != index.shape:
            return None
        perm = out[:, 0].astype(np.int64)
        return None if np.array_equal(perm, np.arange(rows)) else perm

    def clear(self) -> None:
        """Done with the file (ModelRunner clears a checkpoint once its model is built)."""
        self.close()

    def __getitem__(self, hf_name: str) -> torch.Tensor:
        name = self.gguf_name(hf_name)
        if name is None:
            raise KeyError(hf_name)
        t = self._by_name[name]
        ft = FileTensor(t, self._fd, None)
        values = ft.values()
        shape = tuple(int(d) for d in reversed(t.shape))
        values = values.reshape(shape)
        values = np.asarray(self._processor.process(weights=values, name=name).weights,
                            dtype=np.float32)
        return torch.from_numpy(np.ascontiguousarray(values))

    def __contains__(self, hf_name: object) -> bool:
        return isinstance(hf_name, str) and self.gguf_name(hf_name) is not None


class BlockEmbedding(nn.Module):
    """Token embeddings looked up in the file's own rows: a looked-up row is
    dequantized by the gguf package (the file's values exactly, whatever its type), and
    no full-precision table is kept (a 128k-token table of 4,096 is 2 GiB in fp32)."""

    def __init__(self, table: FileTensor, dtype: torch.dtype):
        super().__init__()
        self.qtype, self.cols = table.qtype, table.cols
        # A plain attribute, not a buffer: a cast of the model leaves the bytes alone.
        self.rows = torch.from_numpy(table.raw())
        # Empty; it carries the compute dtype through model.to(dtype).
        self.weight = nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        raw = self.rows.index_select(0, ids.cpu()).numpy()
        if self.qtype == T.F32:
            values = raw.view(np.float32)
        else:
            values = np.asarray(dequantize(raw, self.qtype), dtype=np.float32)
        out = torch.from_numpy(values.reshape(len(raw), self.cols))
        return out.to(device=ids.device, dtype=self.weight.dtype)
