"""The C kernels of the CPU path (csrc/), compiled for this machine on first use:
the causal softmax of scores held whole, a gather of K/V into head-major order,
decode attention read in place through block tables, RMSNorm, and matmuls of a few
rows against int8/int4/uint8 weights (see kernels.quant_linear).

On the avx512-bf16 path (kernels.cpu_features) the sources are built once with the
system's C compiler into a per-user cache and loaded with ctypes (kernels.c_build):
a second or so, once. On other paths or without a compiler, `available()` is False
and callers keep their torch ops or take the fp32 kernels (kernels.f32_kernels).
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from pathlib import Path

import torch

from kernels import c_build, kv_quant, quant_layout
from kernels.c_build import compiler
from kernels.cpu_features import AVX512_BF16_FLAGS, cpu_path

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(
    CSRC / name
    for name in (
        "causal_softmax.c", "paged_decode.c", "gather_kv.c", "rms_norm.c", "quant_linear.c",
        "decode_stack.c",
    )
)
HEADERS = (CSRC / "vec.h", CSRC / "kernels.h", CSRC / "stack.h")
# Named instruction sets instead of -march=native: the library also runs on another
# machine with these flags (a cache dir shared over NFS, an image built elsewhere).
CFLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp")
NEEDED_FLAGS = AVX512_BF16_FLAGS


def build(cc: list[str], dest_dir: Path) -> Path:
    """Compile the sources once per (sources, compiler, flags); return the library."""
    return c_build.build("cpu_kernels", cc, dest_dir, SOURCES, HEADERS, CFLAGS)


@cache
def _library() -> ctypes.CDLL | None:
    if cpu_path() != "avx512-bf16":
        return None
    lib = c_build.load("cpu_kernels", SOURCES, HEADERS, CFLAGS, compiler())
    if lib is None:
        return None
    fn = lib.causal_softmax_bf16
    fn.argtypes = (ctypes.c_void_p,) + (ctypes.c_int64,) * 3 + (ctypes.c_int,)
    fn.restype = ctypes.c_int
    fn = lib.paged_decode_attention_bf16
    fn.argtypes = (
        (ctypes.c_void_p,) * 4
        + (ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
        + (ctypes.c_int64,) * 5
        + (ctypes.c_float, ctypes.c_int)
    )
    fn.restype = ctypes.c_int
    fn = lib.rms_norm_bf16
    fn.argtypes = (ctypes.c_void_p,) * 3 + (ctypes.c_int64,) * 2 + (ctypes.c_float, ctypes.c_int)
    fn.restype = None
    fn = lib.gather_head_major
    fn.argtypes = (
        (ctypes.c_void_p,) * 2
        + (ctypes.c_int64, ctypes.c_void_p)
        + (ctypes.c_int64,) * 3
        + (ctypes.c_int,)
    )
    fn.restype = None
    for name in ("quant_linear_int8", "quant_linear_int4", "quant_linear_uint8"):
        fn = getattr(lib, name)
        fn.argtypes = (
            (ctypes.c_void_p, ctypes.c_int)
            + (ctypes.c_int64,) * 3
            + (ctypes.c_void_p,) * 2
            + (ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
        )
        fn.restype = ctypes.c_int
    for name in ("dequant_int8", "dequant_int4", "dequant_uint8"):
        fn = getattr(lib, name)
        fn.argtypes = (
            (ctypes.c_void_p,) * 2 + (ctypes.c_int64,) * 3 + (ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
        )
        fn.restype = None
    fn = lib.matmul_bf16
    fn.argtypes = (
        (ctypes.c_void_p,) + (ctypes.c_int64,) * 3 + (ctypes.c_void_p, ctypes.c_int64)
        + (ctypes.c_void_p, ctypes.c_int)
    )
    fn.restype = ctypes.c_int
    fn = lib.decode_stack
    fn.argtypes = (
        (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        + (ctypes.c_void_p,) * 4
        + (ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
        + (ctypes.c_int,)
    )
    fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    """True where the compiled kernels run here (AVX512-BF16 and a C compiler)."""
    return _library() is not None


def _bf16_cpu(*tensors: torch.Tensor) -> bool:
    """Every tensor is a contiguous bf16 CPU tensor: what the C kernels read."""
    return all(t.is_cpu and t.dtype == torch.bfloat16 and t.is_contiguous() for t in tensors)


def runs_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True where rms_norm takes these: bf16 CPU tensors, x contiguous rows of
    weight's size, and the kernels available."""
    return _bf16_cpu(x, weight) and x.shape[-1] == weight.shape[0] and available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rms_norm(x) over the last dim, with torch's roundings: x normalised in
    fp32 and rounded to bf16, then multiplied by the weight and rounded again."""
    lib = loaded()
    if not (_bf16_cpu(x, weight) and x.shape[-1] == weight.shape[0]):
        raise ValueError("expected contiguous bf16 CPU rows and a weight of their size")
    out = torch.empty_like(x)
    dim = weight.shape[0]
    lib.rms_norm_bf16(
        x.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        x.numel() // dim,
        dim,
        eps,
        torch.get_num_threads(),
    )
    return out


def runs_gather(cache: torch.Tensor) -> bool:
    """True where gather_head_major takes this cache: bf16 on the CPU, contiguous,
    and the kernels available."""
    return _bf16_cpu(cache) and available()


def gather_head_major(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence from cache [blocks, block_size,
    kv_heads, D] through its block table, as [kv_heads, length, D]."""
    lib = loaded()
    _, block_size, kv_heads, head_dim = cache.shape
    if not _bf16_cpu(cache):
        raise ValueError("expected a contiguous bf16 CPU cache")
    if table.dtype != torch.int64 or table.stride(-1) != 1:
        raise ValueError("expected an int64 block table with contiguous entries")
    if table.numel() * block_size < length:
        raise ValueError(f"a table of {table.numel()} blocks cannot hold {length} tokens")
    out = cache.new_empty(kv_heads, length, head_dim)
    lib.gather_head_major(
        cache.data_ptr(),
        table.data_ptr(),
        length,
        out.data_ptr(),
        kv_heads,
        head_dim * cache.element_size(),
        block_size,
        torch.get_num_threads(),
    )
    return out


def runs_decode(k_cache: torch.Tensor) -> bool:
    """True where paged_decode_attention takes this cache: bf16 on the CPU, head_dim
    a multiple of 16 up to 256, and the kernels available."""
    head_dim = k_cache.shape[-1]
    return head_dim % 16 == 0 and head_dim <= 256 and runs_gather(k_cache)


def loaded() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise RuntimeError("the compiled CPU kernels are not available on this machine")
    return lib


def causal_softmax_(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Softmax in place over the last dim of bf16 CPU scores [..., rows, L] of n
    queries, the last n of L positions: row r is query r % n and sees keys
    0 .. L - n + r % n; later keys get 0. Within one bf16 step of torch's softmax
    over the same scores with -inf past each query."""
    lib = loaded()
    if not _bf16_cpu(scores):
        raise ValueError("expected contiguous bf16 CPU scores")
    length = scores.shape[-1]
    if not 0 < n <= length:
        raise ValueError(f"{n} queries cannot be the last of {length} positions")
    rows = scores.numel() // length
    if rows % n:
        raise ValueError(f"{rows} score rows are not whole groups of {n} queries")
    if lib.causal_softmax_bf16(scores.data_ptr(), rows, n, length, torch.get_num_threads()):
        raise MemoryError("no memory for the softmax's row buffers")
    return scores


def check_paged_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       tables: torch.Tensor, lens: torch.Tensor, dtype: torch.dtype,
                       cache_dtypes: tuple[torch.dtype, ...] | None = None) -> None:
    """ValueError unless a paged decode attention call (this library's or the fp32
    one's) can read these: contiguous CPU query in dtype and caches in dtype (or one of
    cache_dtypes), of one shape and dtype, heads a multiple of the KV heads, int64
    tables and lens, one of each per query."""
    batch, heads, head_dim = query.shape
    kv_heads, cache_dim = k_cache.shape[2], kv_quant.head_dim_of(k_cache)
    cache_dtypes = cache_dtypes or (dtype,)
    if not (all(t.is_cpu and t.is_contiguous() for t in (query, k_cache, v_cache))
            and query.dtype == dtype and k_cache.dtype in cache_dtypes
            and v_cache.dtype == k_cache.dtype and v_cache.shape == k_cache.shape):
        name = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype))
        raise ValueError(f"expected a contiguous {name} query and caches of one shape")
    if cache_dim != head_dim or heads % kv_heads:
        raise ValueError(f"{heads} heads of {head_dim} over a cache of {kv_heads} x {cache_dim}")
    if tables.dtype != torch.int64 or lens.dtype != torch.int64 or tables.stride(-1) != 1:
        raise ValueError("expected int64 tables (rows contiguous) and lens")
    if tables.shape[0] != batch or lens.shape != (batch,) or not lens.is_contiguous():
        raise ValueError("expected one table row and one length per query")


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of one query token per sequence, query [B, H, D], over its first
    lens[b] cached tokens, read through tables [B, >= ceil(lens / block_size)] from
    the bf16 caches [blocks, block_size, kv_heads, D]: bf16 [B, H, D]."""
    lib = loaded()
    check_paged_decode(query, k_cache, v_cache, tables, lens, torch.bfloat16)
    batch, heads, head_dim = query.shape
    _, block_size, kv_heads, _ = k_cache.shape
    out = torch.empty_like(query)
    rc = lib.paged_decode_attention_bf16(
        query.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        tables.data_ptr(),
        tables.stride(0),
        lens.data_ptr(),
        out.data_ptr(),
        batch,
        heads,
        kv_heads,
        head_dim,
        block_size,
        scale,
        torch.get_num_threads(),
    )
    if rc == 2:
        raise ValueError(f"head_dim {head_dim} is not a multiple of 16 up to 256")
    if rc:
        raise MemoryError("no memory for the decode attention's score buffers")
    return out


QUANT_MAX_ROWS = 8


def quant_available() -> bool:
    """True where the quantized matmuls (quant_linear.c) run here: as the kernels."""
    return available()


def _check_quant(kind: str, data: torch.Tensor, scale: torch.Tensor, in_features: int) -> int:
    """A quantized weight's tensors as kernels/quant_layout.py stores them, and readable
    by C (contiguous, on the CPU); its padded width."""
    in_pad = quant_layout.check(kind, data, scale, in_features)
    if not (data.is_cpu and scale.is_cpu and data.is_contiguous() and scale.is_contiguous()):
        raise ValueError("expected contiguous CPU weight tensors")
    return in_pad


def quant_linear(
    x: torch.Tensor, kind: str, data: torch.Tensor, scale: torch.Tensor, in_features: int
) -> torch.Tensor:
    """x [rows <= 8, in] (bf16 or fp32, contiguous CPU) times a quantized weight's
    transpose: [rows, out] in x's dtype."""
    lib = loaded()
    in_pad = _check_quant(kind, data, scale, in_features)
    if x.dtype not in (torch.bfloat16, torch.float32) or not (x.is_cpu and x.is_contiguous()):
        raise ValueError("expected contiguous bf16 or fp32 CPU rows")
    if x.dim() != 2 or x.shape[1] != in_features or not 0 < x.shape[0] <= QUANT_MAX_ROWS:
        raise ValueError(
            f"expected [1..{QUANT_MAX_ROWS}, {in_features}] rows, got {tuple(x.shape)}"
        )
    out_features = data.shape[0]
    y = x.new_empty(x.shape[0], out_features)
    bf16 = int(x.dtype == torch.bfloat16)
    fn = getattr(lib, f"quant_linear_{kind}")
    rc = fn(x.data_ptr(), bf16, x.shape[0], in_features, in_pad, data.data_ptr(),
            scale.data_ptr(), out_features, y.data_ptr(), bf16, torch.get_num_threads())
    if rc == 1:
        raise MemoryError("no memory for the quantized activations")
    if rc:
        raise ValueError("bad shape for the quantized matmul")
    return y


def runs_bf16_matmul(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True where bf16_matmul takes these: 1..QUANT_MAX_ROWS contiguous bf16 CPU rows and
    a contiguous bf16 weight whose width is theirs and a multiple of 64."""
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= QUANT_MAX_ROWS
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
        and weight.shape[1] % 64 == 0
        and _bf16_cpu(x, weight)
        and available()
    )


def bf16_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [rows <= 8, in] times weight [out, in]^T, both bf16, in C (bf16 dot products,
    fp32 sums, rounded once): the decode step's matmul for plain bf16 weights."""
    lib = loaded()
    if not runs_bf16_matmul(x, weight):
        raise ValueError(
            f"expected [1..{QUANT_MAX_ROWS}, in] bf16 rows and a bf16 [out, in] weight with in "
            f"a multiple of 64, got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    y = x.new_empty(x.shape[0], weight.shape[0])
    rc = lib.matmul_bf16(x.data_ptr(), x.shape[0], x.shape[1], weight.shape[1],
                         weight.data_ptr(), weight.shape[0], y.data_ptr(), torch.get_num_threads())
    if rc == 1:
        raise MemoryError("no memory for the matmul's activations")
    return y


def dequantize(
    kind: str, data: torch.Tensor, scale: torch.Tensor, in_features: int, dtype: torch.dtype
) -> torch.Tensor:
    """A quantized weight as a plain [out, in] tensor of dtype (bf16 or fp32)."""
    lib = loaded()
    in_pad = _check_quant(kind, data, scale, in_features)
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"cannot dequantize to {dtype}")
    dst = torch.empty(data.shape[0], in_features, dtype=dtype)
    fn = getattr(lib, f"dequant_{kind}")
    fn(data.data_ptr(), scale.data_ptr(), data.shape[0], in_features, in_pad, dst.data_ptr(),
       int(dtype == torch.bfloat16), torch.get_num_threads())
    return dst
