"""Owns the model and the KV pool; turns a scheduled batch into next-token logits."""

from __future__ import annotations

import logging

import numpy as np
import torch

from inference import file_weights, memory_plan
from inference.config import EngineConfig
from inference.cpu_allocator import (
    available_memory_bytes,
    keep_heap_pages,
    release_free_heap,
    zeros_mapped_on_write,
)
from inference.gguf_checkpoint import GGUFCheckpoint
from inference.kv_groups import GroupedMetadata, kv_groups, model_windows
from inference.loader import model_cache_dir
from inference.models.llama import RotaryEmbedding
from inference.models.registry import build_model, text_config
from inference.prompt_logprobs import PromptScoring
from inference.quantize import cached_weights, quantize_model, quantized_cache_file
from inference.sequence import Sequence
from kernels import kv_quant
from kernels.attention import AttentionMetadata
from kernels.cpu_features import cpu_path

log = logging.getLogger(__name__)


def kv_bytes_per_block(model_config, block_size: int, dtype: torch.dtype,
                       layers: int | None = None) -> int:
    """K and V of every layer (or of `layers` of them: a KV group's page) for one block
    of tokens in a pool of dtype (kv_quant.POOL_DTYPE: int8 rows); the head_dim is the
    config's own where it has one (Qwen3, Gemma 3),
    which need not be hidden / heads."""
    model_config = text_config(model_config)
    heads = model_config.num_key_value_heads
    head_dim = getattr(model_config, "head_dim", None) or (
        model_config.hidden_size // model_config.num_attention_heads
    )
    row = kv_quant.pool_last_axis(head_dim, dtype)  # an int8 row carries its scale
    layers = model_config.num_hidden_layers if layers is None else layers
    return 2 * layers * block_size * heads * row * dtype.itemsize


def kv_dtype_name(dtype: torch.dtype) -> str:
    """EngineConfig.kv_dtype's name for a pool dtype ("int8" for int8 rows)."""
    return "int8" if dtype == kv_quant.POOL_DTYPE else str(dtype).removeprefix("torch.")


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config, state_dict: dict[str, torch.Tensor]):
        """Build the model from transformers' state_dict, which it consumes: the dict is
        emptied once its weights are in the model, before the KV pool is allocated."""
        self.config = config
        self.device = torch.device(config.device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        if self.device.type == "cpu":
            keep_heap_pages()
        self.dtype = config.torch_dtype
        self.block_size = config.block_size
        with torch.device(self.device):
            model = build_model(model_config)
        kind = self.stored_kind(config)
        from_file = isinstance(state_dict, GGUFCheckpoint)
        if from_file and self.device.type == "cpu":
            # Refused with the numbers before a weight is read.
            memory_plan.check_weights_fit(state_dict.path.name, state_dict.file_bytes,
                                          available_memory_bytes())
        if from_file and kind in ("int8", "int4"):
            # A GGUF file's matmuls on its own blocks, never dequantized whole.
            file_weights.load(model, state_dict, kind, model_cache_dir(config.model_cache_dir))
        else:
            # bf16 storage is a cast, cheaper than reading a cache file back.
            cache_file = None if kind in (None, "bf16") else quantized_cache_file(config)
            cached = cached_weights(model, kind, cache_file)
            # Weights the cache holds are never read from the checkpoint.
            model.load_hf_state_dict(state_dict, linear=cached is None)
            if kind is not None:
                quantize_model(model, kind, cache_file, cached)
                if model.embed_from_head():
                    log.info("token embeddings read from the output head's %s rows (exact)",
                             model.lm_head.quantized.kind)
        self.model = model.to(dtype=self.dtype).eval()
        # The checkpoint's tensors and the full-precision weights that quantizing or a
        # cast replaced go back to the system before the pool is allocated: with them
        # still held, loading an int4 SmolLM2 peaked at 1.8 GiB (1.4 without).
        state_dict.clear()
        if self.device.type == "cpu":
            release_free_heap()
        self.kv_dtype = self.cache_dtype(config, kind)
        config.kv_dtype = kv_dtype_name(self.kv_dtype)  # "auto" resolved
        # The kernel path (kernels.cpu_features) the engine took, for logs and metrics.
        self.cpu_path = cpu_path() if self.device.type == "cpu" else self.device.type
        log.info("kernel path: %s (%s activations, %s weights, %s KV cache)", self.cpu_path,
                 config.dtype, config.weight_dtype, config.kv_dtype)
        self.kv_groups = kv_groups(model_windows(self.model), config.sliding_window_kv)
        # Each layer's (group, slot in its group's pages), for GroupedMetadata.
        places = [self.kv_groups.place(i) for i in range(self.kv_groups.num_layers)]
        self._layer_places = ([g for g, _ in places], [j for _, j in places])
        if self.kv_groups.hybrid:
            log.info("KV groups of %d layers: %d full, %d sliding (window %s)",
                     self.kv_groups.group_size, len(self.kv_groups.full),
                     len(self.kv_groups.sliding),
                     self.kv_groups.windows[self.kv_groups.sliding[0]])
        if self.device.type == "cpu" and (
                self.model.build_decode_stack(self.kv_groups) if self.kv_groups.hybrid
                else self.model.build_decode_stack()):
            log.info("decode steps of up to %d sequences run as one C call",
                     self.model.decode_stack.max_rows)
        groups = self.kv_groups
        # A page holds one KV group's layers; with one group, every layer (a block).
        per_block = kv_bytes_per_block(model_config, self.block_size, self.kv_dtype,
                                       groups.group_size)
        if config.num_blocks:  # blocks of every layer: the same bytes in pages
            requested = config.num_blocks * groups.pages_per_whole_block()
        else:
            requested = max(1, config.kv_cache_memory_bytes // per_block)
        mapped = self.device.type == "cpu"
        # Decode batches are the common shape: oneDNN lays weights out for them. The
        # quantized layers' bf16 copy is left out where it would crowd out the pool.
        on_cpu = config.pack_weights and self.device.type == "cpu"
        copy_bytes = sum(torch.bfloat16.itemsize * m.out_features * m.in_features
                         for m in self.model.linear_layers().values() if m.quantized is not None)
        if on_cpu and copy_bytes and self.dtype == torch.bfloat16 and not memory_plan.copies_fit(
                copy_bytes, requested * per_block, available_memory_bytes()):
            log.warning("no bf16 copy of the quantized weights for many-row matmuls: its "
                        "%.0f MiB and the KV pool would not fit this host's memory (prefill "
                        "dequantizes a tile at a time instead)", copy_bytes / 2**20)
            on_cpu = False
        if on_cpu and self.model.pack_weights(batch_hint=config.max_num_seqs):
            layers = self.model.linear_layers().values()
            embedding = self.model.embed_tokens.weight  # a tied head's plain weight costs nothing
            plain = sum(m.weight.nbytes for m in layers
                        if m.keeps_plain and m.packed is not None and m.weight is not embedding)
            copies = sum(torch.bfloat16.itemsize * m.out_features * m.in_features for m in layers
                         if m.quantized is not None and m.packed is not None)
            log.info("matmul weights packed for oneDNN%s%s",
                     f" ({plain / 2**20:.0f} MiB of bf16 weights also kept plain for the C "
                     "decode step)" if plain else "",
                     f" (quantized weights: a {copies / 2**20:.0f} MiB bf16 copy for many-row "
                     "matmuls; pack_weights=False drops it)" if copies else "")
        # Rotary frequencies stay fp32 for accuracy at long positions.
        for rotary in self.model.modules():
            if isinstance(rotary, RotaryEmbedding):
                rotary.inv_freq = rotary.inv_freq.float()
        # What the memory left after the weights holds, where the host says.
        self.num_blocks = memory_plan.pool_blocks(
            requested, per_block, max(1, self.block_size // groups.pages_per_whole_block()),
            available_memory_bytes() if mapped else None)
        shape = (2, groups.group_size, self.num_blocks, self.block_size,
                 self.model.num_kv_heads, kv_quant.pool_last_axis(self.model.head_dim,
                                                                  self.kv_dtype))
        self.kv_cache = (zeros_mapped_on_write(shape, self.kv_dtype) if mapped
                         else torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
        log.info("KV pool: %d %s of %d tokens (%.1f MiB%s)", self.num_blocks,
                 "pages" if groups.hybrid else "blocks", self.block_size,
                 self.num_blocks * per_block / 2**20, ", resident as written" if mapped else "")

    def cache_dtype(self, config: EngineConfig, stored_kind: str | None) -> torch.dtype:
        """The KV pool's dtype (EngineConfig.kv_dtype; kv_quant.POOL_DTYPE for int8
        rows): "auto" takes int8 rows for an fp32 engine on a CPU whose weights are
        stored compactly, else the compute dtype."""
        if config.kv_dtype == "int8":
            return kv_quant.POOL_DTYPE
        if config.kv_dtype != "auto":
            return getattr(torch, config.kv_dtype)
        compact = stored_kind is not None
        if compact and self.dtype == torch.float32 and self.device.type == "cpu":
            return kv_quant.POOL_DTYPE
        return self.dtype

    def stored_kind(self, config: EngineConfig) -> str | None:
        """The weight dtype the linear layers are stored in apart from the compute dtype
        (quantize_model's kinds), or None where they keep the compute dtype: bf16 in a
        bf16 model is its own dtype, and only the CPU widens bf16 for fp32 rows."""
        kind = config.weight_dtype
        if kind in ("int8", "int4"):
            return kind
        if kind == "bf16" and self.dtype == torch.float32 and self.device.type == "cpu":
            return "bf16"
        return None

    def prepare(self, seqs: list[Sequence], num_tokens: list[int]):
        """Token ids, positions, attention metadata and the rows to sample for one step.
        A hybrid model gets one AttentionMetadata per KV group (GroupedMetadata), each
        with that group's slots and tables. A released entry (out of a sliding window)
        reads as page 0: the keys there lie outside every query's window, so the
        attention's mask hides whatever that page holds."""
        bs, dev = self.block_size, self.device
        num_groups = self.kv_groups.num_groups
        ids, pos = [], []
        query_start_loc, seq_lens = [0], []
        sample_rows: list[int] = []
        slots: list[list[np.ndarray]] = [[] for _ in range(num_groups)]
        for seq, n in zip(seqs, num_tokens, strict=True):
            start = seq.num_computed_tokens
            ids.extend(seq.token_ids[start : start + n])
            p = np.arange(start, start + n)
            pos.append(p)
            for g, table in enumerate([seq.block_table, *seq.group_tables]):
                slots[g].append(np.asarray(table, dtype=np.int64)[p // bs] * bs + p % bs)
            query_start_loc.append(query_start_loc[-1] + n)
            seq_lens.append(start + n)
            if start + n == seq.num_tokens:
                sample_rows.append(query_start_loc[-1] - 1)
        width = max(len(s.block_table) for s in seqs)
        metas = []
        for g in range(num_groups):
            tables = np.zeros((len(seqs), width), dtype=np.int64)
            for i, s in enumerate(seqs):
                table = s.block_table if g == 0 else s.group_tables[g - 1]
                tables[i, : len(table)] = table
            if num_groups > 1:
                np.maximum(tables, 0, out=tables)  # RELEASED entries read page 0
            metas.append(AttentionMetadata(
                slot_mapping=torch.from_numpy(np.concatenate(slots[g])).to(dev),
                block_tables=torch.from_numpy(tables).to(dev),
                query_start_loc=query_start_loc,
                seq_lens=seq_lens,
            ))
        meta = (GroupedMetadata(metas, *self._layer_places) if self.kv_groups.hybrid
                else metas[0])
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        positions = torch.from_numpy(np.concatenate(pos)).to(dev)
        return input_ids, positions, meta, sample_rows

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_tokens: list[int],
                scoring: PromptScoring | None = None) -> torch.Tensor | None:
        """Run one step; logits [rows, vocab], in the model's dtype, for the sequences
        whose chunk reaches their end. `scoring`: prompt positions whose next token's
        logprob is recorded from this step's hidden states (inference.prompt_logprobs)."""
        input_ids, positions, meta, sample_rows = self.prepare(seqs, num_tokens)
        hidden = self.model(input_ids, positions, self.kv_cache, meta)
        if scoring:
            scoring.score(hidden, self.model.compute_logits)
        if not sample_rows:
            return None
        rows = torch.tensor(sample_rows, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, rows)).cpu()

    @torch.inference_mode()
    def full_logits(self, seqs: list[Sequence], num_tokens: list[int]) -> torch.Tensor:
        """fp32 logits for every scheduled token (for parity tests and scoring)."""
        input_ids, positions, meta, _ = self.prepare(seqs, num_tokens)
        hidden = self.model(input_ids, positions, self.kv_cache, meta)
        return self.model.compute_logits(hidden).float().cpu()
