"""Compile a set of C sources into a shared library once per (sources, compiler,
flags), into a per-user cache, and load it with ctypes. Nothing is downloaded:
where there is no compiler or the compile fails, the caller gets None and keeps
its torch ops."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


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


def build(
    name: str,
    cc: list[str],
    dest_dir: Path,
    sources: Sequence[Path],
    headers: Sequence[Path],
    cflags: Sequence[str],
) -> Path:
    """The library `name` built from sources; compiled only when no library of the same
    sources, headers, compiler and flags is in dest_dir."""
    text = b"".join(p.read_bytes() for p in (*sources, *headers))
    key = hashlib.sha256(text + repr((cc, tuple(cflags))).encode()).hexdigest()[:16]
    lib = dest_dir / f"{name}-{key}.so"
    if not lib.exists():
        dest_dir.mkdir(parents=True, exist_ok=True)
        # Built beside its final name and renamed: processes starting together
        # never load a half-written file.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=dest_dir)
        os.close(fd)
        try:
            subprocess.run(
                [*cc, *cflags, "-shared", "-fPIC", "-o", tmp, *map(str, sources), "-lm"],
                check=True,
                capture_output=True,
                text=True,
                timeout=300,
            )
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("compiled %s", lib)
    return lib


def load(
    name: str,
    sources: Sequence[Path],
    headers: Sequence[Path],
    cflags: Sequence[str],
    cc: list[str] | None,
) -> ctypes.CDLL | None:
    """The compiled library, or None (with a warning) where it cannot be had."""
    if cc is None:
        log.warning("no C compiler found: the %s kernels are unavailable, keeping torch ops", name)
        return None
    try:
        return ctypes.CDLL(str(build(name, cc, cache_dir(), sources, headers, cflags)))
    except subprocess.CalledProcessError as e:
        log.warning("compiling the %s kernels failed, keeping torch ops:\n%s", name, e.stderr)
    except (subprocess.SubprocessError, OSError) as e:  # a timeout, an unwritable cache
        log.warning("the %s kernels are unavailable (%s); keeping torch ops", name, e)
    return None
