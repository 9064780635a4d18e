"""A whole decode step in one C call: every layer of a Llama-family model (or, in
fp32, a Gemma 3 one) for a few rows of one new token each, then the final norm, for
matmul weights that are all
stored (quantized, or bf16 on an fp32 step) or all plain, with widths that are
multiples of 64. Same ops as the torch forward, without its ~300 Python-dispatched
ops and per-kernel thread wake-ups. Two builds of it:
- bf16 (csrc/decode_stack.c, the avx512-bf16 path): bf16 activations and cache, with
  the torch forward's bf16 roundings at the same places;
- fp32 (csrc/f32/decode.c, every other path): fp32 activations and cache.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from kernels import cpu_kernels, f32_kernels, kv_quant
from kernels.quant_layout import padded
from kernels.quant_linear import QuantizedWeight

# Rows (decoding sequences) a step takes: the bf16 step's, and the fp32 step's.
MAX_ROWS = cpu_kernels.QUANT_MAX_ROWS
MAX_F32_ROWS = f32_kernels.MAX_ROWS


class _Matmul(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int64),
        ("data", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("in_features", ctypes.c_int64),
        ("in_pad", ctypes.c_int64),
        ("out", ctypes.c_int64),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("qkv", _Matmul),
        ("o", _Matmul),
        ("gate_up", _Matmul),
        ("down", _Matmul),
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("attn_out_norm", ctypes.c_void_p),
        ("mlp_out_norm", ctypes.c_void_p),
        ("window", ctypes.c_int64),
        ("rope", ctypes.c_int64),
        ("kv_slot", ctypes.c_int64),
        ("group", ctypes.c_int64),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("inter", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("layer", ctypes.POINTER(_Layer)),
        ("norm", ctypes.c_void_p),
        ("act", ctypes.c_int64),
        ("kv_layers", ctypes.c_int64),
        ("table_group_stride", ctypes.c_int64),
        ("kv_kind", ctypes.c_int64),
    ]


Weight = QuantizedWeight | torch.Tensor  # stored, or plain [out, in] in the step's dtype


@dataclass
class StackLayer:
    """One decoder layer's weights: norms in the step's dtype, the matmuls' weights,
    q/k/v's bias if any, and Qwen3's per-head q and k norms if any (the fp32 step's).
    Gemma 3's parts (the fp32 step's): norms of the attention's and the MLP's outputs
    before each joins the residual stream (post_norm is then the pre-MLP norm), a
    sliding window (0: none), and which cos/sin set of the step its RoPE takes. With KV
    groups (inference/kv_groups.py, the fp32 step's): the slot of the cache's layer axis
    its K/V take (None: its index) and the group whose slots and tables it reads."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Weight
    o: Weight
    gate_up: Weight
    down: Weight
    qkv_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None
    mlp_out_norm: torch.Tensor | None = None
    window: int = 0
    rope: int = 0
    kv_slot: int | None = None
    group: int = 0


# The C kinds: csrc/kernels.h for the bf16 step (plain bf16 is 2), csrc/f32/f32.h for
# the fp32 one (bf16-stored is 2, plain fp32 4).
C_KINDS = {"int8": 0, "int4": 1, "uint8": 3}
PLAIN_BF16 = 2
F32_KINDS = f32_kernels.KINDS
STEP_DTYPES = (torch.bfloat16, torch.float32)
# The MLP's activation on its gate (csrc/stack.h).
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def dims(w: Weight) -> tuple[int, int]:
    """(out, in) of a weight."""
    if isinstance(w, QuantizedWeight):
        return w.out_features, w.in_features
    return tuple(w.shape)


def _vector(t: torch.Tensor, size: int, dtype: torch.dtype) -> bool:
    return t.dtype == dtype and t.is_cpu and t.is_contiguous() and t.shape == (size,)


def takes_plain(w: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a step in dtype reads this plain weight: contiguous, on the CPU, in dtype,
    its width a multiple of 64."""
    return (w.dim() == 2 and w.dtype == dtype and w.is_cpu and w.is_contiguous()
            and w.shape[1] % 64 == 0 and w.shape[1] > 0)


def _matmul(w: Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> _Matmul:
    out, inp = dims(w)
    plain_kind = PLAIN_BF16 if dtype == torch.bfloat16 else F32_KINDS["fp32"]
    kinds = C_KINDS if dtype == torch.bfloat16 else F32_KINDS
    if isinstance(w, torch.Tensor):
        if not takes_plain(w, dtype):
            raise ValueError(f"expected a contiguous {dtype} CPU weight whose width is a "
                             "multiple of 64")
        kind, data, scale, in_pad = plain_kind, w.data_ptr(), None, inp
    else:
        if w.kind not in kinds or w.kind == "fp32" or not (w.data.is_cpu and w.data.is_contiguous()):
            raise ValueError(f"a {w.kind} weight is not read by the {dtype} step")
        scale = w.scale.data_ptr() if w.scale.numel() else None
        kind, data, in_pad = kinds[w.kind], w.data.data_ptr(), padded(inp)
    if bias is not None and not _vector(bias, out, dtype):
        raise ValueError(f"expected a contiguous {dtype} bias of the layer's outputs")
    return _Matmul(kind, data, scale, None if bias is None else bias.data_ptr(), inp, in_pad, out)


def runs_here(dtype: torch.dtype) -> bool:
    """Whether the C step of dtype runs on this machine's path."""
    if dtype == torch.bfloat16:
        return cpu_kernels.available()
    return dtype == torch.float32 and f32_kernels.available()


class DecodeStack:
    """The C decode step over a model's weights; the tensors must outlive it (it holds
    their addresses, and a reference to each)."""

    def __init__(self, layers: list[StackLayer], norm: torch.Tensor, heads: int,
                 kv_heads: int, head_dim: int, eps: float, scale: float | None = None,
                 act: str = "silu"):
        """scale: the attention's (head_dim ** -0.5 unless given); act: the MLP's
        activation (ACTIVATIONS)."""
        hidden, dtype = norm.shape[0], norm.dtype
        if dtype not in STEP_DTYPES:
            raise ValueError(f"no C decode step in {dtype}")
        lanes = 16 if dtype == torch.bfloat16 else 8
        if not layers or head_dim % lanes or head_dim > 256 or heads % kv_heads:
            raise ValueError(f"{heads} heads of {head_dim} over {kv_heads} KV heads")
        inter = dims(layers[0].gate_up)[0] // 2
        shapes = {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
                  "o": (hidden, heads * head_dim), "gate_up": (2 * inter, hidden),
                  "down": (hidden, inter)}
        for layer in layers:
            for name, shape in shapes.items():
                if dims(getattr(layer, name)) != shape:
                    out, inp = dims(getattr(layer, name))
                    raise ValueError(f"{name} is {out} x {inp}, expected {shape[0]} x {shape[1]}")
            if not (_vector(layer.input_norm, hidden, dtype)
                    and _vector(layer.post_norm, hidden, dtype)):
                raise ValueError(f"expected contiguous {dtype} norm weights of the hidden size")
            if (layer.q_norm is None) != (layer.k_norm is None) or layer.q_norm is not None and not (
                    dtype == torch.float32 and _vector(layer.q_norm, head_dim, dtype)
                    and _vector(layer.k_norm, head_dim, dtype)):
                raise ValueError("per-head q/k norms: both, fp32 and of the head size (the "
                                 "bf16 step has none)")
            out_norms = [n for n in (layer.attn_out_norm, layer.mlp_out_norm) if n is not None]
            gemma = out_norms or layer.window or layer.rope
            if gemma and dtype != torch.float32:
                raise ValueError("Gemma 3's layers are the fp32 step's (the bf16 step has "
                                 "no output norms, window or second RoPE)")
            if not all(_vector(n, hidden, dtype) for n in out_norms):
                raise ValueError(f"expected contiguous {dtype} output norms of the hidden size")
            if layer.window < 0 or layer.rope not in (0, 1):
                raise ValueError("a window is a token count (0: none); rope is 0 or 1")
        slots = [i if w.kv_slot is None else w.kv_slot for i, w in enumerate(layers)]
        groups = 1 + max(w.group for w in layers)
        if min(slots) < 0 or min(w.group for w in layers) < 0:
            raise ValueError("a layer's KV slot and group are indices")
        if (groups > 1 or slots != list(range(len(layers)))) and dtype != torch.float32:
            raise ValueError("KV groups are the fp32 step's (the bf16 step reads one table)")
        if act not in ACTIVATIONS or act != "silu" and dtype != torch.float32:
            raise ValueError(f"no {act!r} activation in the {dtype} step")
        if not _vector(norm, hidden, dtype):
            raise ValueError(f"expected a contiguous {dtype} final norm weight")
        self._keep = (layers, norm)
        self._layers = (_Layer * len(layers))(*(
            _Layer(w.input_norm.data_ptr(), w.post_norm.data_ptr(), _matmul(w.qkv, w.qkv_bias, dtype),
                   _matmul(w.o, None, dtype), _matmul(w.gate_up, None, dtype),
                   _matmul(w.down, None, dtype),
                   None if w.q_norm is None else w.q_norm.data_ptr(),
                   None if w.k_norm is None else w.k_norm.data_ptr(),
                   None if w.attn_out_norm is None else w.attn_out_norm.data_ptr(),
                   None if w.mlp_out_norm is None else w.mlp_out_norm.data_ptr(),
                   w.window, w.rope, slot, w.group)
            for w, slot in zip(layers, slots, strict=True)
        ))
        self._model = _Model(len(layers), hidden, heads, kv_heads, head_dim, inter, 0, eps,
                             head_dim**-0.5 if scale is None else scale, self._layers,
                             norm.data_ptr(), ACTIVATIONS[act], max(slots) + 1, 0)
        # The cache's layer axis (a KV group's layers, or every layer) and the groups.
        self.kv_layers, self.groups = max(slots) + 1, groups
        self.hidden, self.head_dim, self.kv_heads, self.dtype = hidden, head_dim, kv_heads, dtype
        self.ropes = 1 + max(w.rope for w in layers)
        self.max_rows = MAX_ROWS if dtype == torch.bfloat16 else MAX_F32_ROWS

    def runs(self, rows: int, kv_cache: torch.Tensor) -> bool:
        """True where the step takes these: 1..max_rows rows and a contiguous CPU cache
        [2, layers, blocks, block_size, kv_heads, head_dim] in the step's dtype, or in
        bf16 or int8 rows (kernels/kv_quant) for the fp32 step (layers: a KV group's
        slots, with groups)."""
        return (
            0 < rows <= self.max_rows
            and (kv_cache.dtype == self.dtype
                 or self.dtype == torch.float32 and kv_cache.dtype in f32_kernels.CACHE_DTYPES)
            and kv_cache.is_cpu
            and kv_cache.is_contiguous()
            and kv_cache.dim() == 6
            and kv_cache.shape[:2] == (2, self.kv_layers)
            and kv_cache.shape[4] == self.kv_heads
            and kv_quant.head_dim_of(kv_cache) == self.head_dim
        )

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 slots: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor,
                 lens: torch.Tensor) -> torch.Tensor:
        """The final-normed hidden states [rows, hidden] after every layer, for new
        tokens' embeddings x [rows, hidden] (overwritten with the residual stream) at
        cos/sin [rows, head_dim] (sin sign-folded; all in the step's dtype; [2, rows,
        head_dim] for layers of two RoPEs), stored at slots [rows], over contexts of
        lens [rows] tokens (the new one included) read through tables. With KV groups,
        slots [groups, rows] and tables [groups, rows, width]: each group's own."""
        rows = x.shape[0]
        if not self.runs(rows, kv_cache):
            raise ValueError("the decode step does not take this batch or cache")
        rope = (rows, self.head_dim) if self.ropes == 1 else (self.ropes, rows, self.head_dim)
        for t, shape in ((x, (rows, self.hidden)), (cos, rope), (sin, rope)):
            if t.dtype != self.dtype or tuple(t.shape) != shape or not t.is_contiguous():
                raise ValueError(f"expected contiguous {self.dtype} {shape}, got {tuple(t.shape)}")
        per_group = (rows,) if self.groups == 1 else (self.groups, rows)
        for t, shape in ((slots, per_group), (lens, (rows,))):
            if t.dtype != torch.int64 or tuple(t.shape) != shape or not t.is_contiguous():
                raise ValueError("expected one int64 slot (per KV group) and length per row")
        blocks, block_size = kv_cache.shape[2], kv_cache.shape[3]
        if (tables.dtype != torch.int64 or tables.dim() != len(per_group) + 1
                or tuple(tables.shape[:-1]) != per_group or tables.stride(-1) != 1
                or tables.shape[-1] * block_size < int(lens.max())):
            raise ValueError("expected int64 block tables covering every context")
        if int(slots.max()) >= blocks * block_size or not 0 <= int(tables.min()) <= int(
                tables.max()) < blocks:
            raise ValueError("a slot or block lies outside the cache")
        if int(lens.min()) < 1:
            raise ValueError("every row attends to at least its own token")
        self._model.block_size = block_size
        self._model.table_group_stride = tables.stride(0) if self.groups > 1 else 0
        self._model.kv_kind = (f32_kernels.CACHE_KINDS[kv_cache.dtype]
                               if self.dtype == torch.float32 else 0)
        out = torch.empty_like(x)
        lib = cpu_kernels.loaded() if self.dtype == torch.bfloat16 else f32_kernels.loaded()
        step = lib.decode_stack if self.dtype == torch.bfloat16 else lib.f32_decode_stack
        rc = step(
            ctypes.byref(self._model), x.data_ptr(), rows, cos.data_ptr(), sin.data_ptr(),
            slots.data_ptr(), kv_cache.data_ptr(), blocks, tables.data_ptr(), tables.stride(-2),
            lens.data_ptr(), out.data_ptr(), torch.get_num_threads(),
        )
        if rc == 1:
            raise MemoryError("no memory for the decode step's buffers")
        if rc:
            raise ValueError("bad shape for the decode step")
        return out
