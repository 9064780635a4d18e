"""What the CPU offers, and the kernel path the engine takes on it.

The path is chosen once per process from /proc/cpuinfo and the machine's
architecture:

- ``avx512-bf16``: AVX512 with native bf16 dot products (and AMX where listed):
  bf16 activations, the kernels of csrc/ (cpu_kernels);
- ``avx2``: AVX2 + FMA + F16C: fp32 activations, the kernels of csrc/f32/
  (f32_kernels) built for AVX2;
- ``neon``: ARM64: the same fp32 kernels, which the compiler vectorizes with NEON;
- ``generic``: any other CPU: the same fp32 kernels in portable C.

``PREFIXCHAT_CPU_PATH`` forces a lesser path on a CPU that has a better one (an
AVX512 host can run the AVX2 and generic paths; a path the CPU lacks is refused
with a warning). Pair it with the variables of ``LIBRARY_ENV`` (torch's
``ATEN_CPU_CAPABILITY``, oneDNN's ``ONEDNN_MAX_CPU_ISA``, MKL's
``MKL_ENABLE_INSTRUCTIONS``), set before torch is imported, to bring the libraries'
own kernels down to the same level (``make test-avx2`` does); a forced path without
them is logged.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Mapping
from functools import cache

log = logging.getLogger(__name__)

PATHS = ("avx512-bf16", "avx2", "neon", "generic")
ENV = "PREFIXCHAT_CPU_PATH"
# The flags each x86 path's kernels are compiled for.
AVX512_BF16_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"})
AVX2_FLAGS = frozenset({"avx2", "fma", "f16c"})
# What brings the libraries' own kernels down to a forced path; each is read once, when
# the library loads. MKL's matters most: it runs every fp32 GEMM (the fp32 paths'
# prefill), and uncapped it keeps an Intel host's AVX512 on the forced AVX2 path.
LIBRARY_ENV = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "generic": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def _cpuinfo_field(name: str) -> str | None:
    """The first /proc/cpuinfo line's value for `name`, or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


@cache
def cpu_flags() -> frozenset[str]:
    return frozenset((_cpuinfo_field("flags") or "").split())


@cache
def cpu_vendor() -> str:
    """x86's vendor string (GenuineIntel, AuthenticAMD, ...), or "" elsewhere."""
    return _cpuinfo_field("vendor_id") or ""


def is_arm64() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def detected_path() -> str:
    """The best path this CPU runs."""
    flags = cpu_flags()
    if flags >= AVX512_BF16_FLAGS:
        return "avx512-bf16"
    if flags >= AVX2_FLAGS:
        return "avx2"
    if is_arm64():
        return "neon"
    return "generic"


def runs_path(path: str) -> bool:
    """Whether this CPU can run `path` (every CPU runs generic)."""
    best = detected_path()
    if path == "generic" or path == best:
        return True
    if path == "avx2":
        return best == "avx512-bf16" and cpu_flags() >= AVX2_FLAGS
    return False


@cache
def cpu_path() -> str:
    """The path this process takes: $PREFIXCHAT_CPU_PATH where this CPU runs it, else
    the best one it runs."""
    forced = os.environ.get(ENV, "").strip().lower()
    best = detected_path()
    if not forced or forced == "auto":
        return best
    if forced not in PATHS:
        log.warning("%s=%s is not one of %s; taking %s", ENV, forced, ", ".join(PATHS), best)
        return best
    if not runs_path(forced):
        log.warning("%s=%s: this CPU cannot run it; taking %s", ENV, forced, best)
        return best
    unset = missing_library_env(forced)
    if unset:
        log.warning("%s=%s without %s: the libraries' own kernels keep this CPU's best "
                    "instructions", ENV, forced, assignments(unset))
    return forced


def assignments(env: Mapping[str, str]) -> str:
    """'A=1 B=2', as a shell command line sets them."""
    return " ".join(f"{k}={v}" for k, v in env.items())


def missing_library_env(path: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of LIBRARY_ENV[path] that `env` (this process's) lacks or sets
    otherwise, with the values they should have; empty where none is wanted."""
    env = os.environ if env is None else env
    return {k: v for k, v in LIBRARY_ENV.get(path, {}).items()
            if env.get(k, "").strip().lower() != v.lower()}


def has_native_bf16() -> bool:
    """bf16 matmuls run in hardware (AVX512-BF16 or AMX) on this path, not emulated."""
    return cpu_path() == "avx512-bf16" and bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def has_amx() -> bool:
    """AMX tiles, which torch's CPU flash-attention kernel uses for bf16, on this path."""
    return cpu_path() == "avx512-bf16" and "amx_bf16" in cpu_flags()
