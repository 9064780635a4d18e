"""The fp32 C kernels (csrc/f32/): matmuls of a few fp32 rows against weights kept
at their stored size (int8, uint8, int4, bf16 or fp32), their dequantizers, decode
attention over an fp32 paged cache, and the whole fp32 decode step
(kernels.decode_stack).

One portable source, built once per path (kernels.cpu_features): with AVX2, FMA and
F16C on the avx2 path (and on avx512-bf16 hosts, for an fp32 engine), with the
compiler's defaults elsewhere (NEON on ARM64, SSE2 on other x86-64). Loaded with
ctypes; `available()` is False without a compiler, and callers keep torch's ops.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from kernels import c_build, kv_quant, quant_layout
from kernels.c_build import compiler
from kernels.cpu_features import AVX2_FLAGS, cpu_flags, cpu_path
from kernels.cpu_kernels import check_paged_decode

CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(CSRC / "f32" / f for f in ("linear.c", "decode.c", "gemm.c", "attention.c"))
HEADERS = tuple(CSRC / "f32" / f for f in ("simd.h", "f32.h", "kv_row.h", "tile.h")) + (
    CSRC / "stack.h",)
BASE_FLAGS = ("-O3", "-fopenmp", "-Wno-psabi")
AVX2_CFLAGS = ("-mavx2", "-mfma", "-mf16c")
# Rows a call takes (csrc/f32/f32.h's F32_MAX_BATCH): decode steps of up to this many
# sequences, in groups of 8 whose sums stay in registers.
MAX_ROWS = 32
# The C weight kinds (csrc/f32/f32.h).
KINDS = {"int8": 0, "int4": 1, "bf16": 2, "uint8": 3, "fp32": 4}


def cflags() -> tuple[str, ...]:
    """AVX2 instructions where this path has them; the compiler's defaults elsewhere."""
    if cpu_path() in ("avx512-bf16", "avx2") and cpu_flags() >= AVX2_FLAGS:
        return BASE_FLAGS + AVX2_CFLAGS
    return BASE_FLAGS


def build(cc: list[str], dest_dir: Path) -> Path:
    return c_build.build("f32_kernels", cc, dest_dir, SOURCES, HEADERS, cflags())


@cache
def _library() -> ctypes.CDLL | None:
    lib = c_build.load("f32_kernels", SOURCES, HEADERS, cflags(), compiler())
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.f32_linear.argtypes = (ctypes.c_int, ptr, i64, i64, i64, ptr, ptr, i64, ptr, ctypes.c_int)
    lib.f32_linear.restype = ctypes.c_int
    lib.f32_dequant.argtypes = (ctypes.c_int, ptr, ptr, i64, i64, i64, ptr, ctypes.c_int)
    lib.f32_dequant.restype = ctypes.c_int
    lib.f32_gemm.argtypes = (ctypes.c_int, ptr, i64, i64, i64, ptr, ptr, i64, ptr, ctypes.c_int)
    lib.f32_gemm.restype = ctypes.c_int
    lib.f32_tiles_fast.argtypes = ()
    lib.f32_tiles_fast.restype = ctypes.c_int
    lib.f32_int_dots.argtypes = ()
    lib.f32_int_dots.restype = ctypes.c_int
    lib.f32_paged_decode_attention.argtypes = (
        (ptr,) * 4 + (i64, ptr, ptr) + (i64,) * 5 + (ctypes.c_float, i64, ctypes.c_int,
                                                     ctypes.c_int)
    )
    lib.f32_paged_decode_attention.restype = ctypes.c_int
    lib.f32_prefill_attention.argtypes = (
        (ptr, i64, ptr, ptr, ptr) + (i64,) * 3 + (ptr,) + (i64,) * 4
        + (ctypes.c_float, ctypes.c_int, ctypes.c_int))
    lib.f32_prefill_attention.restype = ctypes.c_int
    lib.f32_store_kv.argtypes = (ptr, i64, ptr, i64, ptr, ptr, ptr) + (i64,) * 4 + (
        ctypes.c_int, ctypes.c_int)
    lib.f32_store_kv.restype = ctypes.c_int
    lib.f32_decode_stack.argtypes = (
        (ptr, ptr, i64) + (ptr,) * 4 + (i64, ptr, i64, ptr, ptr) + (ctypes.c_int,)
    )
    lib.f32_decode_stack.restype = ctypes.c_int
    return lib


def available() -> bool:
    """True where the fp32 kernels run here (a C compiler)."""
    return _library() is not None


def loaded() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise RuntimeError("the compiled fp32 CPU kernels are not available on this machine")
    return lib


def _f32_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.is_cpu and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def _check_weight(kind: str, data: torch.Tensor, scale: torch.Tensor | None, in_features: int) -> int:
    """The weight's padded width; ValueError unless it is `kind` as stored."""
    if kind == "fp32":
        if data.dtype != torch.float32 or data.dim() != 2 or data.shape[1] != quant_layout.padded(
                in_features):
            raise ValueError("expected an fp32 weight padded to a multiple of 64 columns")
        in_pad = data.shape[1]
    else:
        in_pad = quant_layout.check(kind, data, scale, in_features)
    if not (data.is_cpu and data.is_contiguous()) or (
            scale is not None and not (scale.is_cpu and scale.is_contiguous())):
        raise ValueError("expected contiguous CPU weight tensors")
    return in_pad


def _scale_ptr(scale: torch.Tensor | None) -> int | None:
    return None if scale is None or scale.numel() == 0 else scale.data_ptr()


# Rows a call takes on the integer dots, where this build has them (csrc/f32/linear.c).
INT_DOT_ROWS = 2


def int_dots() -> bool:
    """True where one or two fp32 rows of a quantized weight take the integer dots: each
    group of 32 activations rounded to int16 on its own scale (amax / 32767). False
    where the kernels are not here."""
    return available() and bool(loaded().f32_int_dots())


def runs_linear(x: torch.Tensor) -> bool:
    """True where linear takes x: 1..MAX_ROWS contiguous fp32 CPU rows, and the kernels here."""
    return x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and _f32_cpu(x) and available()


def linear(x: torch.Tensor, kind: str, data: torch.Tensor, scale: torch.Tensor | None,
           in_features: int) -> torch.Tensor:
    """x [rows <= MAX_ROWS, in] (fp32) times a stored weight's transpose: fp32 [rows, out]."""
    return _matmul(loaded().f32_linear, MAX_ROWS, x, kind, data, scale, in_features)


def _matmul(entry, max_rows: int | None, x: torch.Tensor, kind: str, data: torch.Tensor,
            scale: torch.Tensor | None, in_features: int) -> torch.Tensor:
    """x [1..max_rows (None: any), in] times the stored weight's transpose through the C
    `entry` (f32_linear or f32_gemm, which take the same arguments)."""
    in_pad = _check_weight(kind, data, scale, in_features)
    if not (x.dim() == 2 and 0 < x.shape[0] <= (max_rows or x.shape[0])
            and x.shape[1] == in_features and _f32_cpu(x)):
        raise ValueError(f"expected [1..{max_rows or 'any'}, {in_features}] contiguous fp32 "
                         f"CPU rows, got {tuple(x.shape)} {x.dtype}")
    y = x.new_empty(x.shape[0], data.shape[0])
    rc = entry(KINDS[kind], x.data_ptr(), x.shape[0], in_features, in_pad, data.data_ptr(),
               _scale_ptr(scale), data.shape[0], y.data_ptr(), torch.get_num_threads())
    if rc == 1:
        raise MemoryError("no memory for the matmul's activations")
    if rc:
        raise ValueError("bad shape for the fp32 matmul")
    return y


@cache
def tiles_fast() -> bool:
    """True where the register tile of gemm and prefill_attention is measured to beat
    torch's kernels on this build (AVX2); they run, slower, everywhere. Cached: every
    layer of a prefill asks, and the answer is the build's."""
    return available() and bool(loaded().f32_tiles_fast())


def gemm(x: torch.Tensor, kind: str, data: torch.Tensor, scale: torch.Tensor | None,
         in_features: int) -> torch.Tensor:
    """x [rows, in] (fp32, any number of rows) times a stored weight's transpose, with
    the weight dequantized a panel at a time inside the GEMM: fp32 [rows, out]."""
    return _matmul(loaded().f32_gemm, None, x, kind, data, scale, in_features)


def dequantize(kind: str, data: torch.Tensor, scale: torch.Tensor | None,
               in_features: int) -> torch.Tensor:
    """A stored weight as a plain fp32 [out, in] tensor."""
    lib = loaded()
    in_pad = _check_weight(kind, data, scale, in_features)
    dst = torch.empty(data.shape[0], in_features, dtype=torch.float32)
    if lib.f32_dequant(KINDS[kind], data.data_ptr(), _scale_ptr(scale), data.shape[0],
                       in_features, in_pad, dst.data_ptr(), torch.get_num_threads()):
        raise ValueError("bad shape for the dequantizer")
    return dst


# The caches the fp32 kernels read, by the kind csrc/f32/decode.c calls them: fp32, bf16
# widened in registers (half the bytes), or int8 rows with a scale (kernels/kv_quant).
CACHE_KINDS = {torch.float32: 0, torch.bfloat16: 1, kv_quant.POOL_DTYPE: 2}
CACHE_DTYPES = tuple(CACHE_KINDS)


def runs_decode(k_cache: torch.Tensor) -> bool:
    """True where paged_decode_attention takes this cache: fp32, bf16 or int8 rows on
    the CPU, contiguous, head_dim a multiple of 8 up to 256, and the kernels here."""
    head_dim = kv_quant.head_dim_of(k_cache)
    return (head_dim % 8 == 0 and 0 < head_dim <= 256 and k_cache.dtype in CACHE_DTYPES
            and k_cache.is_cpu and k_cache.is_contiguous() and available())


def paged_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           tables: torch.Tensor, lens: torch.Tensor, scale: float,
                           window: int | None = None) -> torch.Tensor:
    """Attention of one query token per sequence, query [B, H, D], over its first
    lens[b] cached tokens read through tables from fp32, bf16 or int8 caches [blocks,
    block_size, kv_heads, D] (int8: rows of D + 4 bytes): fp32 [B, H, D]. A sliding
    window sees only the last `window` of them."""
    lib = loaded()
    check_paged_decode(query, k_cache, v_cache, tables, lens, torch.float32, CACHE_DTYPES)
    batch, heads, head_dim = query.shape
    _, block_size, kv_heads, _ = k_cache.shape
    out = torch.empty_like(query)
    rc = lib.f32_paged_decode_attention(
        query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
        tables.stride(0), lens.data_ptr(), out.data_ptr(), batch, heads, kv_heads, head_dim,
        block_size, scale, window or 0, CACHE_KINDS[k_cache.dtype],
        torch.get_num_threads(),
    )
    if rc == 2:
        raise ValueError(f"head_dim {head_dim} is not a multiple of 8 up to 256")
    if rc:
        raise MemoryError("no memory for the decode attention's score buffers")
    return out


def runs_prefill_attention(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """True where prefill_attention takes these: fp32 query rows [n, heads, head_dim]
    (heads side by side), an fp32, bf16 or int8-row cache on the CPU, contiguous,
    head_dim a multiple of 16 up to 256, and the kernels here."""
    head_dim = kv_quant.head_dim_of(k_cache)
    return (query.is_cpu and query.dtype == torch.float32 and query.dim() == 3
            and query.stride(2) == 1 and query.stride(1) == query.shape[2]
            and head_dim % 16 == 0 and 0 < head_dim <= 256 and k_cache.dtype in CACHE_DTYPES
            and k_cache.is_cpu and k_cache.is_contiguous() and available())


def prefill_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      table: torch.Tensor, length: int, scale: float) -> torch.Tensor:
    """Causal attention of n queries [n, H, D] (fp32), the last n of `length` positions
    of one sequence, over its K/V read through its block table (int64) from fp32, bf16
    or int8 caches [blocks, block_size, kv_heads, row]: fp32 [n, H, D]."""
    lib = loaded()
    n, heads, head_dim = query.shape
    blocks, block_size, kv_heads, _ = k_cache.shape
    if not (runs_prefill_attention(query, k_cache) and v_cache.dtype == k_cache.dtype
            and v_cache.shape == k_cache.shape and v_cache.is_contiguous()
            and kv_quant.head_dim_of(k_cache) == head_dim and heads % kv_heads == 0
            and 0 < n <= length and table.dtype == torch.int64 and table.is_contiguous()
            and table.dim() == 1 and table.shape[0] * block_size >= length):
        raise ValueError("expected fp32 query rows, their caches and an int64 block table "
                         "covering the sequence")
    out = query.new_empty(n, heads, head_dim)
    rc = lib.f32_prefill_attention(
        query.data_ptr(), query.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
        table.data_ptr(), blocks, n, length, out.data_ptr(), heads, kv_heads, head_dim,
        block_size, scale, CACHE_KINDS[k_cache.dtype], torch.get_num_threads())
    if rc == 1:
        raise MemoryError("no memory for the prefill attention's K/V")
    if rc:
        raise ValueError("bad shape for the prefill attention, or a block of the table past "
                         "the end of the cache")
    return out


def _token_rows(x: torch.Tensor) -> bool:
    """fp32 CPU rows [tokens, kv_heads, head_dim] whose heads lie side by side (a token's
    row may sit in a wider tensor: the K and V of a fused qkv projection)."""
    return (x.is_cpu and x.dtype == torch.float32 and x.dim() == 3 and x.stride(2) == 1
            and x.stride(1) == x.shape[2])


def runs_store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """True where store_kv takes these rows and this cache: fp32 rows, an fp32, bf16 or
    int8-row cache on the CPU, contiguous, and the kernels here."""
    return (_token_rows(key) and _token_rows(value) and key.shape == value.shape
            and k_cache.dtype in CACHE_DTYPES and k_cache.is_cpu and k_cache.is_contiguous()
            and available())


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """key, value [tokens, kv_heads, head_dim] (fp32) into their slots of the caches
    [blocks, block_size, kv_heads, row], rounded as the C decode step stores them (bf16 to
    nearest even; int8 rows as kernels.kv_quant.quantize, bit for bit); a slot below 0
    is skipped."""
    lib = loaded()
    tokens, kv_heads, head_dim = key.shape
    if not (runs_store_kv(key, value, k_cache) and v_cache.dtype == k_cache.dtype
            and v_cache.shape == k_cache.shape and v_cache.is_contiguous()
            and tuple(k_cache.shape[2:]) == (kv_heads, kv_quant.pool_last_axis(head_dim,
                                                                            k_cache.dtype))
            and slots.dtype == torch.int64 and slots.is_contiguous()
            and slots.shape == (tokens,)):
        raise ValueError("expected fp32 K/V rows, their caches and an int64 slot per token")
    # The C checks each slot against the pool's tokens before it writes (in the same
    # call, not a torch op a layer).
    rc = lib.f32_store_kv(key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0),
                          k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), tokens,
                          k_cache.shape[0] * k_cache.shape[1], kv_heads, head_dim,
                          CACHE_KINDS[k_cache.dtype], torch.get_num_threads())
    if rc:
        raise ValueError("a K/V slot lies past the end of the cache, or a bad shape")
