"""Gemma 3's text decoder (transformers' Gemma3ForCausalLM) over the paged KV cache.

Where it differs from the Llama family (inference.models.llama, whose matmul layers,
rotary and head it shares):
- five of every six layers attend within a sliding window (config.layer_types,
  config.sliding_window), each kind of layer with its own RoPE (base 10k local,
  1M global, and the global layers' scaling if the config has one);
- RMSNorm scales by (1 + weight), in fp32, and every sub-layer is normed before and
  after; q and k are normed per head;
- the MLP's gate is gelu-tanh; embeddings are scaled by sqrt(hidden) in the
  activation dtype; the attention scale is query_pre_attn_scalar ** -0.5; the final
  logits may be soft-capped.
The window is a mask (kernels.attention.windowed_attention). By default the engine
keeps a sliding layer's KV only for its window (inference/kv_groups.py: the layers in
KV groups, each with its own block table); with EngineConfig.sliding_window_kv off
every layer keeps its whole KV in one table. In fp32 a decode step of a few sequences
runs as one C call (kernels.decode_stack) either way, the (1 + weight) norms handed to
it as fp32 vectors.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from inference.kv_groups import GroupedMetadata, KVGroups
from inference.models.llama import (
    MLP,
    Attention,
    Embedding,
    PagedCausalLM,
    RotaryEmbedding,
    gelu_tanh,
)
from kernels import AttentionMetadata
from kernels.decode_stack import DecodeStack, StackLayer, runs_here

SLIDING = "sliding_attention"
FULL = "full_attention"


class GemmaRMSNorm(nn.Module):
    """RMSNorm whose weight is stored as an offset from one: x / rms(x) * (1 + weight),
    computed in fp32 and rounded once to the input's dtype, as transformers does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + self.weight.float()
        return F.rms_norm(x.float(), scale.shape, scale, self.eps).to(x.dtype)


def layer_types(config) -> list[str]:
    """Each layer's kind (SLIDING or FULL): the config's list, or one full layer in
    every sliding_window_pattern (six) as older configs say."""
    types = getattr(config, "layer_types", None)
    if types is None:
        pattern = getattr(config, "sliding_window_pattern", 6)
        types = [FULL if (i + 1) % pattern == 0 else SLIDING
                 for i in range(config.num_hidden_layers)]
    unknown = set(types) - {SLIDING, FULL}
    if unknown:
        raise ValueError(f"Gemma 3 layer types {sorted(unknown)} are not supported")
    return list(types)


def check_supported(config) -> None:
    """ValueError for the Gemma 3 variants this forward does not compute."""
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError("Gemma 3 with bidirectional attention (an embedding model) "
                         "is not supported")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ValueError("Gemma 3 with attention logit soft-capping is not supported")
    act = getattr(config, "hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu_fast"):
        raise ValueError(f"Gemma 3 with hidden_activation {act!r} is not supported")


class GemmaAttention(Attention):
    def __init__(self, config, window: int | None):
        bias = bool(getattr(config, "attention_bias", False))
        super().__init__(config, bias, o_bias=bias, scale=config.query_pre_attn_scalar**-0.5,
                         window=window, qk_norm=GemmaRMSNorm)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.self_attn = GemmaAttention(config, config.sliding_window if layer_type == SLIDING
                                        else None)
        self.mlp = MLP(config, gelu_tanh)
        eps = config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(self, x, cos, sin, k_cache, v_cache, meta):
        h = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, k_cache, v_cache, meta)
        x = x + self.post_attention_layernorm.forward(h)
        h = self.mlp.forward(self.pre_feedforward_layernorm.forward(x))
        return x + self.post_feedforward_layernorm.forward(h)


class Gemma3ForCausalLM(PagedCausalLM):
    """Gemma 3's text decoder; config is a Gemma3TextConfig (a gemma3 config's
    text_config)."""

    def __init__(self, config):
        super().__init__()
        check_supported(config)
        self.config = config
        types = layer_types(config)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.embed_scale = math.sqrt(config.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, t) for t in types)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        # One rotary per kind of layer that the model has.
        self.rotaries = nn.ModuleDict({t: RotaryEmbedding(config, layer_type=t)
                                       for t in sorted(set(types))})
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)
        self.make_head(config, tied_by_default=True)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata | GroupedMetadata,
    ) -> torch.Tensor:
        """Hidden states [num_tokens, hidden]; kv_cache is [2, layers, blocks, bs, kv_heads,
        dim], or [2, group_size, pages, ...] with a GroupedMetadata."""
        x = self.embed_tokens(input_ids)
        # The scale rounded to the activation dtype first, as transformers does.
        x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        rope = {t: r.forward(positions, x.dtype) for t, r in self.rotaries.items()}
        if isinstance(meta, GroupedMetadata):
            # Window-aware KV (inference/kv_groups.py): each layer reads its group's
            # tables and its slot of the group's pages.
            if self.decode_stack is not None:
                block_size = kv_cache.shape[3]
                ds = [m.decode_batch(block_size) for m in meta.groups]
                d = ds[0]
                if d is not None and d.all_rows and self.decode_stack.runs(len(d.rows),
                                                                           kv_cache):
                    cos, sin = self._stack_rope(rope)
                    # Every group's tables are cut to the same longest context.
                    tables = torch.stack([g.tables for g in ds])
                    slots = torch.stack([m.slot_mapping for m in meta.groups])
                    return self.decode_stack(x, cos, sin, slots, kv_cache, tables, d.lens)
            for i, layer in enumerate(self.layers):
                cos, sin = rope[layer.layer_type]
                slot, group_meta = meta.layer(i)
                x = layer.forward(x, cos, sin, kv_cache[0, slot], kv_cache[1, slot], group_meta)
            return self.norm.forward(x)
        if self.decode_stack is not None:
            d = meta.decode_batch(kv_cache.shape[3])
            if d is not None and d.all_rows and self.decode_stack.runs(len(d.rows), kv_cache):
                cos, sin = self._stack_rope(rope)
                return self.decode_stack(x, cos, sin, meta.slot_mapping, kv_cache, d.tables,
                                         d.lens)
        for i, layer in enumerate(self.layers):
            cos, sin = rope[layer.layer_type]
            x = layer.forward(x, cos, sin, kv_cache[0, i], kv_cache[1, i], meta)
        return self.norm.forward(x)

    @staticmethod
    def _stack_rope(rope: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """One cos/sin set per RoPE, in self.rotaries' order (StackLayer.rope)."""
        cos = torch.stack([c.squeeze(1) for c, _ in rope.values()])
        sin = torch.stack([s.squeeze(1) for _, s in rope.values()])
        if len(rope) == 1:
            cos, sin = cos[0], sin[0]
        return cos, sin

    def build_decode_stack(self, groups: KVGroups | None = None) -> bool:
        """Run decode steps of a few sequences as one C call (kernels.decode_stack) in
        an fp32 model whose matmuls the step reads (see LlamaForCausalLM's); False, and
        the torch forward kept, elsewhere (the bf16 step has no Gemma 3 layer). With
        KV groups each layer reads its group's slots and tables."""
        self.decode_stack = None
        if self.norm.weight.dtype != torch.float32 or not runs_here(torch.float32):
            return False
        if not all(p.is_cpu for p in self.parameters()):
            return False
        matmuls = self.stack_matmuls()
        if matmuls is None:
            return False
        linears, quantized = matmuls

        def scale(norm: GemmaRMSNorm) -> torch.Tensor:  # the step's norms multiply plainly
            return (1.0 + norm.weight.detach().float()).contiguous()

        ropes = list(self.rotaries)
        layers = []
        for i, layer in enumerate(self.layers):
            group, slot = (0, i) if groups is None else groups.place(i)
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(StackLayer(
                scale(layer.input_layernorm), scale(layer.pre_feedforward_layernorm),
                *(m.quantized if quantized else m.weight.data
                  for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)),
                None if attn.qkv_proj.bias is None else attn.qkv_proj.bias.data,
                scale(attn.q_norm), scale(attn.k_norm),
                attn_out_norm=scale(layer.post_attention_layernorm),
                mlp_out_norm=scale(layer.post_feedforward_layernorm),
                window=attn.window or 0, rope=ropes.index(layer.layer_type),
                kv_slot=slot, group=group,
            ))
        attn = self.layers[0].self_attn
        if attn.o_proj.bias is not None:  # the step adds no bias after o_proj
            return False
        try:
            self.decode_stack = DecodeStack(layers, scale(self.norm), attn.num_heads,
                                            attn.num_kv_heads, attn.head_dim, self.norm.eps,
                                            scale=attn.scale, act="gelu_tanh")
        except ValueError:  # a shape the C step does not take
            return False
        for m in linears:
            m.keeps_plain = not quantized
        return True

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head.forward(hidden)
        cap = self.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    layer_norms = ("input_layernorm", "post_attention_layernorm",
                   "pre_feedforward_layernorm", "post_feedforward_layernorm")

    def text_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Gemma3ForCausalLM's names, or a Gemma3 checkpoint's language model renamed."""
        return text_weights(state)


# A Gemma3ForConditionalGeneration checkpoint names its text weights under the
# language model: transformers 5's names, and the older ones published checkpoints use.
_TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                  ("language_model.lm_head.", "lm_head."))


def text_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The language model's weights under Gemma3ForCausalLM's names; other towers'
    (vision, projector) are left out of a multimodal checkpoint."""
    if "model.embed_tokens.weight" in state:
        return state
    out = {}
    for name, tensor in state.items():
        for old, new in _TEXT_PREFIXES:
            if name.startswith(old):
                out[new + name[len(old):]] = tensor
                break
    return out
