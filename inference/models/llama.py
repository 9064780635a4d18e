"""The Llama family (Llama, SmolLM2, Qwen2) written over a paged KV cache.

Weights are transformers' own; q/k/v and gate/up are fused at load time so a
layer does two matmuls where transformers does five.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from kernels import AttentionMetadata, cpu_kernels, paged_attention, store_kvcache
from kernels.cpu_linear import linear, pack_weight, packed_linear
from kernels.decode_stack import MAX_ROWS as MAX_STACK_ROWS
from kernels.decode_stack import DecodeStack, StackLayer, runs_here, takes_plain
from kernels.quant_linear import QuantizedWeight, dequantize, dequantize_for_matmul, quant_linear


class Linear(nn.Linear):
    """nn.Linear whose weight can be packed once for oneDNN (see kernels.cpu_linear)
    or replaced by a quantized copy (see kernels.quant_linear)."""

    packed: torch.Tensor | None = None
    quantized: QuantizedWeight | None = None
    # The C decode step reads the plain weight (a tied head's is the embedding table):
    # packing keeps it beside the packed copy, and a few rows take it
    # (kernels.cpu_linear.linear runs them in C).
    keeps_plain: bool = False

    def reset_parameters(self) -> None:
        """No random initialisation: every weight comes from a checkpoint or a quantized
        cache, and an untouched weight costs no resident memory until it is loaded
        (one read back from the cache is never loaded at all)."""

    def set_quantized(self, qw: QuantizedWeight) -> None:
        if (qw.out_features, qw.in_features) != (self.out_features, self.in_features):
            raise ValueError(
                f"a quantized weight of {qw.out_features} x {qw.in_features} does not fit "
                f"a {self.out_features} x {self.in_features} layer"
            )
        self.quantized = qw
        # Only the quantized copy is read from now on (a tied head leaves the embedding).
        self.weight = nn.Parameter(self.weight.new_empty(0), requires_grad=False)

    def takes_plain_rows(self) -> bool:
        """Whether a few rows can multiply the plain weight in C (the decode step's
        matmul: bf16 on the avx512-bf16 path, fp32 on the others)."""
        if self.weight.dtype == torch.bfloat16:
            return cpu_kernels.runs_bf16_matmul(self.weight[:1], self.weight)
        return runs_here(self.weight.dtype) and takes_plain(self.weight, self.weight.dtype)

    def pack(self, batch_hint: int | None) -> bool:
        """Lay the weight out once for oneDNN where this build can (a bf16 CPU model).
        A quantized layer packs its weight dequantized to bf16, for the rows the C kernel
        does not take (prefill, large decode steps): they would otherwise dequantize it
        and have oneDNN re-lay it out on every call (measured: docs/benchmarks.md). Same
        products; it costs the weight's bf16 size
        beside the quantized copy, which decodes keep reading."""
        if self.quantized is None:
            weight = self.weight
        elif self.weight.dtype == torch.bfloat16:  # the model's compute dtype
            weight = dequantize_for_matmul(self.quantized, torch.bfloat16)
        else:
            return False
        packed = pack_weight(weight, batch_hint)
        if packed is None:
            return False
        self.packed = packed
        if not self.keeps_plain:  # only the packed copy is read from now on
            self.weight = nn.Parameter(self.weight.new_empty(0), requires_grad=False)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            return quant_linear(x, self.quantized, self.bias, self.packed)
        # A kept plain weight serves a few rows (the C decode step's own matmul).
        if self.packed is not None and not (self.keeps_plain and x.shape[0] <= MAX_STACK_ROWS):
            return packed_linear(x, self.packed, self.bias)
        return linear(x, self.weight, self.bias)


class Embedding(nn.Embedding):
    """nn.Embedding without random initialisation: its table comes from a checkpoint, or
    is replaced before it is read (HeadEmbedding, a GGUF file's BlockEmbedding), and an
    untouched table costs no resident memory."""

    def reset_parameters(self) -> None:
        pass


class HeadEmbedding(nn.Module):
    """Token embeddings read from a tied head's stored weight (quantized, or bf16 in an
    fp32 model) where it holds the table exactly, as a GGUF file's Q8_0 token table does:
    a lookup widens its rows, and no full-precision table is kept (SmolLM2 in fp32:
    113 MiB)."""

    def __init__(self, stored: QuantizedWeight, dtype: torch.dtype):
        super().__init__()
        self.stored = stored
        # Empty; it carries the compute dtype through model.to(dtype).
        self.weight = nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        q = self.stored
        rows = QuantizedWeight(q.kind, q.data.index_select(0, ids), q.scale.index_select(0, ids),
                               q.in_features)
        return dequantize(rows, self.weight.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One C call instead of torch's dozen small ops, where it runs (bf16 on CPU).
        if cpu_kernels.runs_rms_norm(x, self.weight):
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        # rms_norm normalises bf16 input in fp32 and rounds once; the weight is applied
        # after that rounding, in the model's dtype: transformers' order of roundings.
        return self.weight * F.rms_norm(x, self.weight.shape, eps=self.eps)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding; transformers computes the frequencies (any rope type)."""

    def __init__(self, config, device=None, layer_type: str | None = None):
        """layer_type: the key of this rotary's parameters in a config that holds one set
        per kind of layer (Gemma 3's sliding_attention and full_attention)."""
        super().__init__()
        rope_type = "default"
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
        if layer_type is not None:
            params = params[layer_type]
        if isinstance(params, dict):
            rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "default":
            base = (params or {}).get("rope_theta", getattr(config, "rope_theta", 10000.0))
            dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
            scaling = 1.0
        else:
            kwargs = {} if layer_type is None else {"layer_type": layer_type}
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, device, **kwargs)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.scaling = scaling

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin for apply_rotary, [tokens, 1, head_dim], built once
        per step for every layer."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos() * self.scaling, freqs.sin() * self.scaling
        cos = torch.cat((cos, cos), dim=-1)
        sin = torch.cat((-sin, sin), dim=-1)
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin for x [tokens, heads, head_dim]. rotate_half(x)
    is x rolled by half a head with its first half negated; the sign lives in
    signed_sin, so the rotation is three ops instead of eight."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class Attention(nn.Module):
    """Paged attention of one layer. A family sets what differs: biases, the scale, a
    sliding window, and the norm over each head of q and of k before RoPE (Qwen3's
    RMSNorm; Gemma's (1 + w) one)."""

    def __init__(self, config, bias: bool, *, o_bias: bool = False, scale: float | None = None,
                 window: int | None = None, qk_norm: type[nn.Module] | None = None):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=o_bias)
        self.scale = scale if scale is not None else self.head_dim**-0.5
        self.window = window  # None: every earlier key
        if qk_norm is None and config.model_type == "qwen3":
            qk_norm = RMSNorm
        self.qk_norm = qk_norm is not None
        if self.qk_norm:
            self.q_norm = qk_norm(self.head_dim, config.rms_norm_eps)
            self.k_norm = qk_norm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj.forward(x)
        # q and k heads side by side: one rotary pass for both.
        qk = qkv[:, : self.q_size + self.kv_size].view(-1, self.num_heads + self.num_kv_heads,
                                                      self.head_dim)
        if self.qk_norm:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat([self.q_norm.forward(q), self.k_norm.forward(k)], dim=1)
        q, k = apply_rotary(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].view(-1, self.num_kv_heads, self.head_dim)
        store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping, meta.all_slots_valid)
        o = paged_attention(q, k_cache, v_cache, meta, self.scale, self.window)
        return self.o_proj.forward(o.reshape(-1, self.q_size))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class MLP(nn.Module):
    """Gated MLP: down(act(gate) * up); act is SiLU (Llama, Qwen) or gelu-tanh (Gemma)."""

    def __init__(self, config, act=F.silu):
        super().__init__()
        self.act = act
        self.inter = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.inter, bias=False)
        self.down_proj = Linear(self.inter, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).split(self.inter, dim=-1)
        return self.down_proj.forward(self.act(gate).mul_(up))


class DecoderLayer(nn.Module):
    def __init__(self, config, bias: bool):
        super().__init__()
        self.self_attn = Attention(config, bias)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, k_cache, v_cache, meta):
        h = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, k_cache, v_cache, meta)
        x = x + h
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class PagedCausalLM(nn.Module):
    """What every model family here shares: its matmul layers (Linear), packing and
    quantization hooks, the tied-head embedding and the output head. A family gives
    embed_tokens, layers (each with self_attn and mlp), norm, lm_head,
    tie_word_embeddings, forward and build_decode_stack; loading transformers' weights is
    shared (layer_norms and text_state say what differs)."""

    def make_head(self, config, tied_by_default: bool) -> None:
        """The output head, tied to embed_tokens where the config says (one Parameter
        for both: packing gives the head its own packed copy and leaves the embedding
        table plain for lookups)."""
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", tied_by_default))
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    # A decoder layer's norms, by transformers' names.
    layer_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")

    def text_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The checkpoint's weights under a text decoder's names (a multimodal family
        renames its language model's)."""
        return state

    def checkpoint_sources(self) -> dict[str, list[str]]:
        """transformers' weight names that each matmul layer (linear_layers) stacks by
        rows: q/k/v and gate/up fused, the head tied to the embedding table or not."""
        out = {}
        for name in self.linear_layers():
            if name == "lm_head":
                out[name] = ["model.embed_tokens.weight" if self.tie_word_embeddings
                             else "lm_head.weight"]
                continue
            layers, index, key = name.split(".", 2)  # "layers", "3", "self_attn.qkv_proj"
            out[name] = [f"model.{layers}.{index}.{p}.weight" for p in FUSED.get(key, (key,))]
        return out

    @torch.no_grad()
    def load_hf_state_dict(self, state: dict[str, torch.Tensor], linear: bool = True,
                           embedding: bool = True) -> None:
        """Copy transformers' weights in, fusing q/k/v and gate/up; linear=False leaves
        the linear layers' weights (see linear_layers) out, for quantized copies read
        from a cache (the checkpoint's pages of them are then never read), and
        embedding=False the token table, for a lookup that replaces it."""
        state = self.text_state(state)

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"weight {name} missing from the checkpoint")
            return state[name]

        if embedding:
            self.embed_tokens.weight.copy_(take("model.embed_tokens.weight"))
        self.norm.weight.copy_(take("model.norm.weight"))
        if not self.tie_word_embeddings and linear:
            self.lm_head.weight.copy_(take("lm_head.weight"))
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            copy_attention_and_mlp(layer, take, p, linear)
            for norm in self.layer_norms:
                getattr(layer, norm).weight.copy_(take(p + norm + ".weight"))

    # The whole decode step in C where the weights allow (see build_decode_stack).
    decode_stack: DecodeStack | None = None

    @property
    def num_kv_heads(self) -> int:
        return self.layers[0].self_attn.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.layers[0].self_attn.head_dim

    def pack_weights(self, batch_hint: int | None = None) -> bool:
        """Pack every matmul weight for oneDNN where this CPU build can (bf16);
        False when nothing was packed."""
        # A tied head's plain weight is the embedding table, kept for lookups anyway: it
        # stays beside the packed copy, and a few rows multiply it in C (faster than
        # oneDNN's packed copy for one row: docs/benchmarks.md), summing as a quantized
        # head's rows do.
        head = self.lm_head
        head.keeps_plain = (self.tie_word_embeddings and head.quantized is None
                            and head.takes_plain_rows())
        packed = [m.pack(batch_hint) for m in self.modules() if isinstance(m, Linear)]
        return any(packed)

    def embed_from_head(self, rows_at_a_time: int = 4096) -> bool:
        """Read embeddings from the tied head's stored weight where it equals the table
        exactly (see HeadEmbedding), and drop the table; False, and the table kept,
        elsewhere. Call it after quantizing, before casting to the compute dtype."""
        head, table = self.lm_head, self.embed_tokens.weight
        if not (self.tie_word_embeddings and head.quantized is not None
                and isinstance(self.embed_tokens, nn.Embedding)):
            return False
        stored = head.quantized
        for i in range(0, table.shape[0], rows_at_a_time):  # small temporaries
            part = QuantizedWeight(stored.kind, stored.data[i : i + rows_at_a_time],
                                   stored.scale[i : i + rows_at_a_time], stored.in_features)
            if not torch.equal(dequantize(part, table.dtype), table[i : i + rows_at_a_time]):
                return False
        self.use_head_embedding()
        return True

    def use_head_embedding(self) -> None:
        """Look embeddings up in the tied head's stored rows (HeadEmbedding) from now on,
        where the caller knows they are the table's values, and drop the table."""
        table = self.embed_tokens.weight
        self.embed_tokens = HeadEmbedding(self.lm_head.quantized, table.dtype)

    def stack_matmuls(self) -> tuple[list[Linear], bool] | None:
        """The layers' matmuls (the head aside) for the C decode step, and whether it
        reads them stored (all quantized, or bf16 in an fp32 model) rather than plain;
        None where it reads neither (a mix, or plain weights it does not take)."""
        linears = [m for name, m in self.linear_layers().items() if name != "lm_head"]
        quantized = all(m.quantized is not None for m in linears)
        if not quantized and not all(m.takes_plain_rows() for m in linears):
            return None
        return linears, quantized

    def linear_layers(self) -> dict[str, Linear]:
        """Every matmul layer by its module name: q/k/v, o, gate/up, down and the head."""
        return {name: m for name, m in self.named_modules() if isinstance(m, Linear)}

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] in the model's dtype: greedy rows need only their
        argmax, which a cast to fp32 (exact for bf16) would not change."""
        return self.lm_head.forward(hidden)


class LlamaForCausalLM(PagedCausalLM):
    """Llama-family decoder; Qwen2 differs by the bias on q/k/v, Qwen3 by an RMSNorm on
    each q and k head before RoPE (and an explicit head_dim).

    Inside the model, modules call their children's forward() directly: none has
    hooks, and nn.Module.__call__ costs a few microseconds a call, which adds up over
    a decode step's ~270 calls.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        bias = config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, bias) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)
        self.make_head(config, tied_by_default=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states [num_tokens, hidden]; kv_cache is [2, layers, blocks, bs, kv_heads, dim]."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        if self.decode_stack is not None:
            d = meta.decode_batch(kv_cache.shape[3])
            if d is not None and d.all_rows and self.decode_stack.runs(len(d.rows), kv_cache):
                return self.decode_stack(x, cos.squeeze(1), sin.squeeze(1), meta.slot_mapping,
                                         kv_cache, d.tables, d.lens)
        for i, layer in enumerate(self.layers):
            x = layer.forward(x, cos, sin, kv_cache[0, i], kv_cache[1, i], meta)
        return self.norm.forward(x)

    def build_decode_stack(self) -> bool:
        """Run decode steps of a few sequences as one C call (kernels.decode_stack)
        where it can: on a CPU whose path has the step in the model's dtype (bf16 on
        avx512-bf16, fp32 on every path), every layer's matmuls stored (quantized, or
        bf16 in an fp32 model) or all plain (call it before pack_weights: a plain
        weight is then kept beside its packed copy, see Linear.keeps_plain). False, and
        the torch forward kept, elsewhere."""
        self.decode_stack = None
        dtype = self.norm.weight.dtype
        norms = [self.norm.weight] + [w for layer in self.layers for w in (
            layer.input_layernorm.weight, layer.post_attention_layernorm.weight)]
        if not (runs_here(dtype) and all(w.is_cpu and w.is_contiguous() for w in norms)):
            return False
        matmuls = self.stack_matmuls()
        if matmuls is None:
            return False
        linears, quantized = matmuls
        layers = [
            StackLayer(
                layer.input_layernorm.weight.data, layer.post_attention_layernorm.weight.data,
                *(m.quantized if quantized else m.weight.data for m in (
                    layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                    layer.mlp.gate_up_proj, layer.mlp.down_proj)),
                None if layer.self_attn.qkv_proj.bias is None
                else layer.self_attn.qkv_proj.bias.data,
                *((layer.self_attn.q_norm.weight.data, layer.self_attn.k_norm.weight.data)
                  if layer.self_attn.qk_norm else ()),
            )
            for layer in self.layers
        ]
        attn = self.layers[0].self_attn
        try:
            self.decode_stack = DecodeStack(layers, self.norm.weight.data, attn.num_heads,
                                            attn.num_kv_heads, attn.head_dim, self.norm.eps)
        except ValueError:  # a shape the C step does not take (head_dim, say)
            return False
        for m in linears:
            m.keeps_plain = not quantized
        return True


# transformers' weights that a fused matmul stacks by rows, in order.
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


@torch.no_grad()
def copy_attention_and_mlp(layer: nn.Module, take, prefix: str, linear: bool = True) -> None:
    """Copy one decoder layer's attention and MLP weights from transformers' names
    (take(name) -> tensor), fusing q/k/v and gate/up; linear=False copies the biases
    and norms only."""
    attn = layer.self_attn
    if linear:
        for fused, parts in FUSED.items():
            layer.get_submodule(fused).weight.copy_(
                torch.cat([take(f"{prefix}{p}.weight") for p in parts]))
        attn.o_proj.weight.copy_(take(prefix + "self_attn.o_proj.weight"))
        layer.mlp.down_proj.weight.copy_(take(prefix + "mlp.down_proj.weight"))
    if attn.qkv_proj.bias is not None:
        attn.qkv_proj.bias.copy_(torch.cat([take(f"{prefix}self_attn.{x}_proj.bias")
                                            for x in "qkv"]))
    if attn.o_proj.bias is not None:
        attn.o_proj.bias.copy_(take(prefix + "self_attn.o_proj.bias"))
    if attn.qk_norm:
        attn.q_norm.weight.copy_(take(prefix + "self_attn.q_norm.weight"))
        attn.k_norm.weight.copy_(take(prefix + "self_attn.k_norm.weight"))
