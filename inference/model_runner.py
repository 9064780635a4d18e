"""Owns the model and the KV pool; turns a scheduled batch into next-token logits."""

from __future__ import annotations

import logging

import numpy as np
import torch

from inference.config import EngineConfig
from inference.cpu_allocator import keep_heap_pages
from inference.models.llama import RotaryEmbedding
from inference.models.registry import build_model, text_config
from inference.quantize import quantize_model, quantized_cache_file
from inference.sequence import Sequence
from kernels.attention import AttentionMetadata
from kernels.cpu_features import cpu_path

log = logging.getLogger(__name__)


def kv_bytes_per_block(model_config, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for one block of tokens; the head_dim is the config's
    own where it has one (Qwen3, Gemma 3), which need not be hidden / heads."""
    model_config = text_config(model_config)
    heads = model_config.num_key_value_heads
    head_dim = getattr(model_config, "head_dim", None) or (
        model_config.hidden_size // model_config.num_attention_heads
    )
    elem = torch.finfo(dtype).bits // 8
    return 2 * model_config.num_hidden_layers * block_size * heads * head_dim * elem


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config, state_dict: dict[str, torch.Tensor]):
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
        model.load_hf_state_dict(state_dict)
        kind = self.stored_kind(config)
        if kind is not None:
            # bf16 storage is a cast, cheaper than reading a cache file back.
            quantize_model(model, kind, None if kind == "bf16" else quantized_cache_file(config))
            if model.embed_from_head():
                log.info("token embeddings read from the output head's %s rows (exact)",
                         model.lm_head.quantized.kind)
        self.model = model.to(dtype=self.dtype).eval()
        # The kernel path (kernels.cpu_features) the engine took, for logs and metrics.
        self.cpu_path = cpu_path() if self.device.type == "cpu" else self.device.type
        log.info("kernel path: %s (%s activations, %s weights)", self.cpu_path, config.dtype,
                 config.weight_dtype)
        if self.device.type == "cpu" and self.model.build_decode_stack():
            log.info("decode steps of up to %d sequences run as one C call",
                     self.model.decode_stack.max_rows)
        # Decode batches are the common shape: oneDNN lays weights out for them.
        on_cpu = config.pack_weights and self.device.type == "cpu"
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
        per_block = kv_bytes_per_block(model_config, self.block_size, self.dtype)
        self.num_blocks = config.num_blocks or max(1, config.kv_cache_memory_bytes // per_block)
        self.kv_cache = torch.zeros(
            2,
            text_config(model_config).num_hidden_layers,
            self.num_blocks,
            self.block_size,
            self.model.num_kv_heads,
            self.model.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        log.info("KV pool: %d blocks of %d tokens (%.1f MiB)", self.num_blocks,
                 self.block_size, self.num_blocks * per_block / 2**20)

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
        bs = self.block_size
        ids, pos, slots = [], [], []
        query_start_loc, seq_lens = [0], []
        sample_rows: list[int] = []
        for seq, n in zip(seqs, num_tokens, strict=True):
            start = seq.num_computed_tokens
            ids.extend(seq.token_ids[start : start + n])
            p = np.arange(start, start + n)
            table = np.asarray(seq.block_table, dtype=np.int64)
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            query_start_loc.append(query_start_loc[-1] + n)
            seq_lens.append(start + n)
            if start + n == seq.num_tokens:
                sample_rows.append(query_start_loc[-1] - 1)
        width = max(len(s.block_table) for s in seqs)
        tables = np.zeros((len(seqs), width), dtype=np.int64)
        for i, s in enumerate(seqs):
            tables[i, : len(s.block_table)] = s.block_table
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(np.concatenate(slots)).to(dev),
            block_tables=torch.from_numpy(tables).to(dev),
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
        )
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        positions = torch.from_numpy(np.concatenate(pos)).to(dev)
        return input_ids, positions, meta, sample_rows

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_tokens: list[int]) -> torch.Tensor | None:
        """Run one step; logits [rows, vocab], in the model's dtype, for the sequences
        whose chunk reaches their end."""
        input_ids, positions, meta, sample_rows = self.prepare(seqs, num_tokens)
        hidden = self.model(input_ids, positions, self.kv_cache, meta)
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
