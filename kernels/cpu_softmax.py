"""The causal softmax of CPU attention (csrc/causal_softmax.c), compiled for this
machine on first use.

On a CPU with AVX512-BF16 the C source is built once with the system's C compiler
into a per-user cache and loaded with ctypes: a second or so, once. Where there is
no such CPU or no compiler, `available()` is False and callers keep torch's
softmax; nothing is downloaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from kernels.cpu_features import cpu_flags

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "causal_softmax.c"
# Named instruction sets instead of -march=native: the library also runs on another
# machine with these flags (a cache dir shared over NFS, an image built elsewhere).
CFLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp")
NEEDED_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"})


def cache_dir() -> Path:
    """$PREFIXCHAT_KERNEL_CACHE, else the XDG cache."""
    if env := os.environ.get("PREFIXCHAT_KERNEL_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "prefixchat" / "kernels"


def compiler() -> list[str] | None:
    if env := os.environ.get("CC"):
        return shlex.split(env)
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def build(cc: list[str], dest_dir: Path) -> Path:
    """Compile the source once per (source, compiler, flags); return the library."""
    key = hashlib.sha256(SOURCE.read_bytes() + repr((cc, CFLAGS)).encode()).hexdigest()[:16]
    lib = dest_dir / f"causal_softmax-{key}.so"
    if not lib.exists():
        dest_dir.mkdir(parents=True, exist_ok=True)
        # Built beside its final name and renamed: processes starting together
        # never load a half-written file.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=dest_dir)
        os.close(fd)
        try:
            subprocess.run(
                [*cc, *CFLAGS, "-shared", "-fPIC", "-o", tmp, str(SOURCE)],
                check=True,
                capture_output=True,
                text=True,
            )
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("compiled %s", lib)
    return lib


@cache
def _library() -> ctypes.CDLL | None:
    if not cpu_flags() >= NEEDED_FLAGS:
        return None
    cc = compiler()
    if cc is None:
        log.warning("no C compiler found: CPU attention keeps torch's softmax")
        return None
    try:
        lib = ctypes.CDLL(str(build(cc, cache_dir())))
    except subprocess.CalledProcessError as e:
        log.warning("compiling %s failed, keeping torch's softmax:\n%s", SOURCE.name, e.stderr)
        return None
    except OSError as e:
        log.warning("the causal softmax library is unavailable (%s); keeping torch's", e)
        return None
    fn = lib.causal_softmax_bf16
    fn.argtypes = (ctypes.c_void_p,) + (ctypes.c_int64,) * 4 + (ctypes.c_int,)
    fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    """True where the compiled softmax runs here (AVX512-BF16 and a C compiler)."""
    return _library() is not None


def causal_softmax_(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Softmax in place over the last dim of bf16 CPU scores [..., rows, L] of n
    queries, the last n of L positions: row r is query r % n and sees keys
    0 .. L - n + r % n; later keys get 0. Within one bf16 step of torch's softmax
    over the same scores with -inf past each query."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the compiled causal softmax is not available on this machine")
    if scores.dtype != torch.bfloat16 or not scores.is_cpu or not scores.is_contiguous():
        raise ValueError("expected contiguous bf16 CPU scores")
    length = scores.shape[-1]
    if not 0 < n <= length:
        raise ValueError(f"{n} queries cannot be the last of {length} positions")
    rows = scores.numel() // length
    if rows % n:
        raise ValueError(f"{rows} score rows are not whole groups of {n} queries")
    if lib.causal_softmax_bf16(scores.data_ptr(), rows, n, length, length, torch.get_num_threads()):
        raise MemoryError("no memory for the softmax's row buffers")
    return scores
