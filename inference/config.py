"""Engine configuration: one dataclass, validated once at start."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.cpu_features import has_native_bf16

DEFAULT_MODEL = "smollm2-135m-instruct"
WEIGHT_DTYPES = ("auto", "bf16", "fp32", "int8", "int4")
KV_DTYPES = ("auto", "bfloat16", "float32", "float16", "int8")


def default_dtype(device: str) -> str:
    """bf16 on CUDA and on CPUs with native bf16 matmuls; fp32 elsewhere (emulated bf16 is slow)."""
    if device.startswith("cuda") or has_native_bf16():
        return "bfloat16"
    return "float32"


@dataclass
class EngineConfig:
    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    device: str = "cpu"
    block_size: int = 16
    # KV pool size: an explicit block count wins over the memory budget.
    num_blocks: int | None = None
    kv_cache_memory_bytes: int = 512 * 1024 * 1024
    max_num_seqs: int = 32
    # Tokens computed per step (None: 256 on CPU, 2048 on GPU). A step holds up every
    # running decode and every new turn queued behind it, so on a CPU, where prefill is
    # slow, a small budget keeps the time to first token of concurrent chats low; a long
    # uncached prompt alone pays a little for the extra steps (measured: docs/benchmarks.md,
    # "The step budget").
    max_num_batched_tokens: int | None = None
    # Tokens a step computes when it holds a single sequence (None: 1,024 on CPU where
    # max_num_batched_tokens is left to its default, else max_num_batched_tokens). With
    # nothing else running or queued, a larger chunk holds no-one up and a lone long
    # prompt computes 5-12 % faster on CPU; a request arriving meanwhile waits for one
    # such step ("The step budget" in docs/benchmarks.md).
    lone_prefill_tokens: int | None = None
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    hash_algorithm: str = "sha256"  # or "xxhash" where installed
    # torch CPU threads for this process (None: torch's default). On a small shared
    # machine 1 avoids waiting for descheduled worker threads on every small op.
    num_threads: int | None = None
    model_cache_dir: str | None = None
    # On CPU, lay bf16 matmul weights out once in oneDNN's blocked format (kernels/cpu_linear);
    # quantized weights get a packed bf16 copy for many-row matmuls (their bf16 size).
    pack_weights: bool = True
    # Linear-layer weights as stored: "auto" keeps them as the file ships them, a GGUF
    # file's own grid (the shipped SmolLM2: int4) or a safetensors folder's dtype
    # (inference.loader.auto_weight_dtype);
    # "bf16" stores bf16 (an fp32 engine on CPU widens them in registers); "fp32" keeps
    # the compute dtype whatever it is; "int8" (8 bits with an offset, the head Q8_0) or
    # "int4" (Q4_1, the head Q8_0) quantize them at load (inference/quantize.layer_kind,
    # kernels/quant_linear).
    weight_dtype: str = "auto"
    # The KV pool's dtype. "auto": "int8" for an fp32 engine on CPU whose weights are
    # stored compactly (bf16, int8, int4: what weight_dtype="auto" gives on every CPU
    # without native bf16); otherwise the compute dtype. "int8" keeps each token's K
    # and V of a head as 8-bit values with an fp32 scale (kernels/kv_quant): 53 % of a
    # bf16 cache's bytes and 27 % of fp32's, so the same kv_cache_memory_bytes holds
    # about twice bf16's tokens and a decode step streams half the bytes from a long
    # context (the fp32 kernels widen the rows in registers; the arithmetic stays
    # fp32). "bfloat16" keeps 16 bits a value. Otherwise only the compute dtype, or
    # bf16 or int8 under fp32 on a CPU.
    kv_dtype: str = "auto"
    # Label used for metrics and the dashboard ("web", "worker@host").
    engine_id: str = "embedded"
    # Host-memory KV tier under the pool (inference/kv_offload.py): evicted cached blocks
    # are copied here and copied back on a later hit instead of being recomputed. Off (0)
    # by default: on CPU the pool already lives in host memory, so the same bytes given
    # to kv_cache_memory_bytes serve hits with no copy; on a GPU, where the pool is
    # scarce device memory, 1 GiB or more of host memory holds ~3,000 SmolLM2 blocks.
    kv_offload_bytes: int = 0
    # A directory that keeps the tier on disk across restarts (None: memory only), at
    # most kv_dir_bytes of it. With kv_dir set the tier is on even if kv_offload_bytes is 0
    # (then every restore reads the disk).
    kv_dir: str | None = None
    kv_dir_bytes: int = 4 * 1024**3
    # A model with sliding-window layers (Gemma 3) keeps those layers' KV only for their
    # window (inference/kv_groups.py): its pool holds pages of a group of layers, and
    # num_blocks / kv_cache_memory_bytes buy the same bytes as for whole-KV blocks. False
    # keeps every layer's whole KV (one block table, as a model without such layers).
    sliding_window_kv: bool = True

    def __post_init__(self) -> None:
        if self.dtype == "auto":
            self.dtype = default_dtype(self.device)
        default_budget = self.max_num_batched_tokens is None
        if default_budget:
            self.max_num_batched_tokens = 256 if self.device == "cpu" else 2048
        if self.lone_prefill_tokens is None:
            cpu_default = default_budget and self.device == "cpu"
            self.lone_prefill_tokens = 1024 if cpu_default else self.max_num_batched_tokens
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.lone_prefill_tokens < self.max_num_batched_tokens:
            raise ValueError("lone_prefill_tokens must be >= max_num_batched_tokens")
        if self.dtype not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.kv_offload_bytes < 0 or self.kv_dir_bytes < 0:
            raise ValueError("kv_offload_bytes and kv_dir_bytes must be >= 0")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(
                f"unsupported weight_dtype {self.weight_dtype!r}; expected one of "
                + ", ".join(map(repr, WEIGHT_DTYPES))
            )
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(
                f"unsupported kv_dtype {self.kv_dtype!r}; expected one of "
                + ", ".join(map(repr, KV_DTYPES))
            )
        if self.kv_dtype not in ("auto", self.dtype) and not (
                self.kv_dtype in ("bfloat16", "int8") and self.dtype == "float32"
                and self.device == "cpu"):
            raise ValueError(f"kv_dtype {self.kv_dtype!r} under dtype {self.dtype!r} on "
                             f"{self.device}: the KV cache keeps the compute dtype, or bf16 "
                             "or int8 under fp32 on a CPU")
        if self.hash_algorithm not in ("sha256", "xxhash"):
            raise ValueError(f"unsupported hash algorithm {self.hash_algorithm!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)
