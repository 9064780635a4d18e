"""Random-weight GGUF files of real models' shapes, written with the gguf package.

Random but well-formed blocks (random levels, fp16 scales of a weight's usual size)
cost the same to load and run as a real model's and need no download. The tokenizer is
the shipped SmolLM2's, its vocabulary padded with unused tokens to the shape's size, so
the embedding table and the output head are as large as the real model's.

The types follow llama.cpp's mixes: Q8_0 is Q8_0 throughout; Q4_K_M is Q4_K but for
the output head and a tied table (Q6_K), and attn_v and ffn_down in the first and last
eighth of the layers and every third between (Q6_K), as llama-quantize lays it out.
Any single type name (Q4_0, Q5_K, ...) puts every matrix in that type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # GGUF architecture: llama, qwen2
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    rope_theta: float = 500000.0
    context: int = 131072
    qkv_bias: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    s.name: s for s in (
        Shape("llama-3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, tied=True),
        Shape("llama-3.2-3b", "llama", 3072, 28, 24, 8, 8192, 128256, tied=True),
        Shape("llama-3.1-8b", "llama", 4096, 32, 32, 8, 14336, 128256, tied=False),
        Shape("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 151936, tied=True,
              rope_theta=1000000.0, context=32768, qkv_bias=True),
    )
}
# Small shapes for tests: K-quants need rows of whole 256-column super-blocks.
TINY = {
    "llama": Shape("tiny-llama", "llama", 256, 2, 4, 2, 512, 2048, tied=True,
                   rope_theta=10000.0, context=2048),
    "qwen2": Shape("tiny-qwen2", "qwen2", 256, 2, 4, 2, 512, 2048, tied=False,
                   rope_theta=10000.0, context=2048, qkv_bias=True),
}
MIXES = ("Q4_K_M", "Q8_0")


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth, and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def matrices(shape: Shape) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of every matrix, in the file's order."""
    out = [("token_embd.weight", shape.vocab, shape.hidden)]
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    for i in range(shape.layers):
        p = f"blk.{i}."
        out += [(p + "attn_q.weight", q, shape.hidden), (p + "attn_k.weight", kv, shape.hidden),
                (p + "attn_v.weight", kv, shape.hidden), (p + "attn_output.weight", shape.hidden, q),
                (p + "ffn_gate.weight", shape.ffn, shape.hidden),
                (p + "ffn_up.weight", shape.ffn, shape.hidden),
                (p + "ffn_down.weight", shape.hidden, shape.ffn)]
    if not shape.tied:
        out.append(("output.weight", shape.vocab, shape.hidden))
    return out


def tensor_type(name: str, shape: Shape, mix: str) -> GGMLQuantizationType:
    if mix == "Q4_K_M":
        if name == "output.weight" or (name == "token_embd.weight" and shape.tied):
            return T.Q6_K
        if name.endswith(("attn_v.weight", "ffn_down.weight")):
            layer = int(name.split(".")[1])
            return T.Q6_K if _more_bits(layer, shape.layers) else T.Q4_K
        return T.Q4_K
    return T[mix]


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Random bytes [rows, row_bytes] of a quantized type, its fp16 scales (and
    minimums) set to a weight's usual size: random bytes there could be inf or NaN."""
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)

    def fp16(lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, size=(n, 1)).astype(np.float16).view(np.uint8)

    # Super-block scales times 6-bit sub-block scales: weights of about 0.05.
    if qtype in (T.Q4_K, T.Q5_K, T.Q2_K):
        raw[:, 0:2], raw[:, 2:4] = fp16(5e-5, 3e-4), fp16(5e-5, 3e-4)
    elif qtype in (T.Q6_K, T.Q3_K):
        raw[:, -2:] = fp16(1e-5, 1e-4)
    elif qtype == T.Q8_0:
        raw[:, 0:2] = fp16(1e-4, 3e-3)
        # llama.cpp rounds to [-127, 127]: level -128 never appears in its files.
        levels = raw[:, 2:].view(np.int8)
        levels[levels == -128] = -127
    elif qtype in (T.Q4_0, T.Q5_0):
        raw[:, 0:2] = fp16(1e-4, 3e-3)
    elif qtype in (T.Q4_1, T.Q5_1):
        raw[:, 0:2], raw[:, 2:4] = fp16(1e-4, 3e-3), fp16(-0.05, -0.01)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return raw.reshape(rows, -1)


def _copy_tokenizer(writer: gguf.GGUFWriter, vocab: int) -> None:
    """SmolLM2's tokenizer keys, its token list padded to `vocab` with unused tokens, or
    cut to its first `vocab` tokens and the merges among them (a test's small model)."""
    from inference.loader import smollm2_gguf_path

    reader = gguf.GGUFReader(smollm2_gguf_path())
    fields = {key: f.contents() for key, f in reader.fields.items()}
    kept = set(fields["tokenizer.ggml.tokens"][:vocab])
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = fields[key]
        if key == "tokenizer.ggml.tokens":
            value = value[:vocab] + [f"<|unused_{i}|>" for i in range(len(value), vocab)]
        elif key == "tokenizer.ggml.token_type":
            value = value[:vocab] + [gguf.TokenType.UNUSED] * (vocab - len(value))
        elif key == "tokenizer.ggml.merges" and len(kept) < len(fields["tokenizer.ggml.tokens"]):
            value = [m for m in value if all(p in kept for p in m.split(" "))
                     and m.replace(" ", "") in kept]
        sub = f.types[1] if len(f.types) > 1 else None
        writer.add_key_value(key, value, f.types[0], sub_type=sub)


def write(path: str | Path, shape: Shape, mix: str, seed: int = 0) -> Path:
    """Write shape's model in mix (a name of MIXES or one type) to path, a tensor at a
    time (an 8B file never sits whole in memory)."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), shape.arch)
    arch = shape.arch
    writer.add_uint32(f"{arch}.context_length", shape.context)
    writer.add_uint32(f"{arch}.embedding_length", shape.hidden)
    writer.add_uint32(f"{arch}.block_count", shape.layers)
    writer.add_uint32(f"{arch}.feed_forward_length", shape.ffn)
    writer.add_uint32(f"{arch}.attention.head_count", shape.heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", shape.kv_heads)
    writer.add_float32(f"{arch}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_uint32(f"{arch}.rope.dimension_count", shape.head_dim)
    writer.add_uint32(f"{arch}.vocab_size", shape.vocab)
    writer.add_name(f"random {shape.name} {mix}")
    _copy_tokenizer(writer, shape.vocab)
    tensors: list[tuple[str, np.ndarray | None, tuple, GGMLQuantizationType]] = []
    for name, rows, cols in matrices(shape):
        qtype = tensor_type(name, shape, mix)
        block, size = GGML_QUANT_SIZES[qtype]
        tensors.append((name, None, (rows, cols), qtype))
        writer.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8),
                               rows * cols // block * size, raw_dtype=qtype)
    small = [("output_norm.weight", shape.hidden)]
    for i in range(shape.layers):
        small += [(f"blk.{i}.attn_norm.weight", shape.hidden), (f"blk.{i}.ffn_norm.weight", shape.hidden)]
        if shape.qkv_bias:
            q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
            small += [(f"blk.{i}.attn_q.bias", q), (f"blk.{i}.attn_k.bias", kv),
                      (f"blk.{i}.attn_v.bias", kv)]
    for name, n in small:
        values = (1.0 + rng.normal(0, 0.1, n) if "norm" in name else rng.normal(0, 0.05, n))
        values = values.astype(np.float32)
        tensors.append((name, values, (n,), T.F32))
        writer.add_tensor_info(name, values.shape, values.dtype, values.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _name, values, dims, qtype in tensors:
        if values is None:
            values = random_blocks(qtype, dims[0], dims[1], rng)
        writer.write_tensor_data(values)
    writer.close()
    return path
