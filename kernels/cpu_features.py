"""What the CPU offers, from Linux's /proc/cpuinfo (empty elsewhere)."""

from __future__ import annotations

from functools import cache


@cache
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_native_bf16() -> bool:
    """AMX-BF16 or AVX512-BF16: bf16 matmuls run in hardware, not emulated."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def has_amx() -> bool:
    """AMX tiles, which torch's CPU flash-attention kernel uses for bf16."""
    return "amx_bf16" in cpu_flags()
