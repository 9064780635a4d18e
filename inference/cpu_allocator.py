"""Keep freed heap memory mapped in a CPU engine process, hand back what loading
freed, and give the KV pool pages only as it is written.

Each layer of a step allocates and frees megabytes (attention scores, gathered
K/V). With glibc's defaults the top of the heap is handed back to the kernel
after every free and faulted in again on the next allocation, and that
page-fault churn made a turn's attention over its cached tokens much slower
(measured: docs/benchmarks.md, "CPU kernels"). Asking glibc to keep 64 MiB of
padding at the top of the heap stops it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import mmap
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

M_TOP_PAD = -2  # glibc's mallopt parameter number
TOP_PAD_BYTES = 64 << 20


@cache
def _glibc_function(name: str, argtypes: tuple) -> Callable | None:
    """A function of glibc's malloc, or None where the C library isn't glibc (musl,
    macOS, Windows). Looked up once: find_library runs a subprocess (1-3 ms), and the
    trim runs each time an engine goes idle."""
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = argtypes
    return function


@cache  # a process-wide setting: once is enough, however many engines start
def keep_heap_pages(top_pad: int = TOP_PAD_BYTES) -> bool:
    """Set glibc's M_TOP_PAD for this process; False where the C library isn't glibc."""
    mallopt = _glibc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    ok = mallopt is not None and bool(mallopt(M_TOP_PAD, top_pad))
    if ok:
        log.info("glibc keeps %d MiB of freed heap mapped", top_pad >> 20)
    return ok


def release_free_heap() -> bool:
    """Hand the heap's free pages back to the kernel (glibc's malloc_trim), once the
    model is loaded: the checkpoint's full-precision tensors that quantizing or bf16
    storage freed lie in pieces of a few MB inside the heap, which glibc keeps
    resident otherwise (an int4 SmolLM2 engine stayed as large as an fp32 one). False
    where the C library isn't glibc."""
    trim = _glibc_function("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


def zeros_mapped_on_write(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero CPU tensor over an anonymous mapping of its own: the kernel gives it a
    page (zeroed) at the first write there, so a KV pool costs resident memory as its
    blocks are used, not all at start (torch.zeros writes every page). A 512 MiB
    pool of which a replay used 288 MiB kept the other 224 MiB off an int4 server's
    RSS. Reading an unwritten page reads zeros, as from torch.zeros."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):  # Windows: no such mapping
        return torch.zeros(shape, dtype=dtype)
    # The tensor holds a reference to the mapping, which lives as long as it does.
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)


def available_memory_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """What the kernel says it could give this process without swapping (MemAvailable),
    or None where it does not say (not Linux)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
