"""Gemma 3 (inference.models.gemma3) against transformers' Gemma3ForCausalLM on tiny
random models whose prompts run past the sliding window, and the window's masking
(kernels.attention.windowed_attention) against plain dense attention."""

from __future__ import annotations

import math

import pytest
import torch

from inference import EngineConfig, LLMEngine, SamplingParams
from inference.model_runner import kv_bytes_per_block
from inference.models.gemma3 import Gemma3ForCausalLM
from inference.models.llama import LlamaForCausalLM
from inference.models.registry import model_class, text_config
from kernels.attention import AttentionMetadata, paged_attention
from kernels.decode_stack import runs_here
from kernels.quant_linear import dequantize
from tests.inference.conftest import make_tiny_model
from tests.inference.test_parity import TOL, hf_logits, our_logits
from tests.inference.test_prefix_cache import rand_ids

WINDOW = 24  # under every prompt here, and not a multiple of the block size (16)
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
# Gemma 3 4B and up scale the global layers' RoPE (linear, 8x); the local ones keep 10k.
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}
# bf16 activations against transformers in fp32, as test_parity's bf16 check.
BF16_TOL = 0.15


def make_tiny_gemma3(dest, seed: int = 0, **extra):
    """Four layers (three sliding, one full), a head_dim that is not hidden / heads,
    query_pre_attn_scalar apart from head_dim, a final soft-cap, and norms away from
    their init so (1 + weight) matters."""
    fields = dict(num_hidden_layers=4, layer_types=LAYER_TYPES, sliding_window=WINDOW,
                  head_dim=32, query_pre_attn_scalar=24, final_logit_softcapping=30.0,
                  rope_parameters=ROPE, rms_norm_eps=1e-6)
    return make_tiny_model(dest, "gemma3_text", seed=seed, norm_std=0.1, **(fields | extra))


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    return make_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3"))


@pytest.fixture(scope="module")
def gemma3_hf(tiny_gemma3):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_gemma3, dtype=torch.float32).eval()


def gemma_engine(path, tmp_path, **kw) -> LLMEngine:
    kw.setdefault("dtype", "float32")
    kw.setdefault("num_blocks", 64)
    return LLMEngine(EngineConfig(model=str(path), model_cache_dir=str(tmp_path), **kw))


def prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_the_registry_picks_the_class_from_the_model_type():
    from transformers import Gemma3Config, Gemma3TextConfig, LlamaConfig, MistralConfig

    text = Gemma3TextConfig(vocab_size=256, num_hidden_layers=6, head_dim=256, hidden_size=640,
                            intermediate_size=64, num_attention_heads=4, num_key_value_heads=1,
                            sliding_window=512)
    assert model_class(text) is Gemma3ForCausalLM
    both = Gemma3Config(text_config=text.to_dict())
    assert model_class(both) is Gemma3ForCausalLM and text_config(both).model_type == "gemma3_text"
    assert model_class(LlamaConfig()) is LlamaForCausalLM
    with pytest.raises(ValueError, match="'mistral' is not supported"):
        model_class(MistralConfig())
    # K and V of 6 layers x 16 tokens x 1 KV head x head_dim 256 (not 640 / 4) in bf16.
    assert kv_bytes_per_block(both, 16, torch.bfloat16) == 2 * 6 * 16 * 1 * 256 * 2
    assert [layer.self_attn.window for layer in Gemma3ForCausalLM(text).layers] == [512] * 5 + [None]


def dense_attention(q, k, v, scale, window):
    """Reference: one sequence's queries [n, H, D], the last n of the keys [L, kv, D],
    each seeing the keys at most window - 1 positions before its own."""
    n, heads, _ = q.shape
    length, kv_heads, _ = k.shape
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), k.double()) * scale
    q_pos = torch.arange(length - n, length)[:, None]
    k_pos = torch.arange(length)[None, :]
    scores.masked_fill_((k_pos > q_pos) | (k_pos <= q_pos - window), float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v.double()).float()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("window", [1, 7, 24, 1000])
def test_windowed_attention_matches_dense_attention_in_a_mixed_step(window, dtype, tol):
    """Decode rows, a chunk over its cached prefix, whole prompts (one longer than a
    slice of queries) and short chunks batched together, in one step; then a step of
    decodes only (the fp32 C kernel's window where it runs, torch's flash call in bf16)."""
    torch.manual_seed(0)
    block_size, kv_heads, heads, dim = 16, 2, 4, 32
    # (query tokens, context length) per sequence.
    shapes = [(1, 40), (1, 5), (12, 60), (9, 9), (300, 300), (3, 20), (4, 18), (1, 90)]
    blocks_each = [math.ceil(length / block_size) for _, length in shapes]
    k_cache = torch.randn(sum(blocks_each) + 1, block_size, kv_heads, dim).to(dtype)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(sum(blocks_each)) + 1  # scattered blocks, none at 0
    tables = torch.zeros(len(shapes), max(blocks_each), dtype=torch.int64)
    at = 0
    for i, b in enumerate(blocks_each):
        tables[i, :b] = perm[at : at + b]
        at += b
    starts = [0]
    for n, _ in shapes:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(slot_mapping=torch.zeros(starts[-1], dtype=torch.int64),
                             block_tables=tables, query_start_loc=starts,
                             seq_lens=[length for _, length in shapes])
    query = torch.randn(starts[-1], heads, dim).to(dtype)
    scale = 0.3
    out = paged_attention(query, k_cache, v_cache, meta, scale, window)
    for i, (n, length) in enumerate(shapes):
        k = k_cache[tables[i, : blocks_each[i]]].flatten(0, 1)[:length]
        v = v_cache[tables[i, : blocks_each[i]]].flatten(0, 1)[:length]
        want = dense_attention(query[starts[i] : starts[i + 1]], k, v, scale, window)
        assert (out[starts[i] : starts[i + 1]].float() - want).abs().max().item() < tol, (n, length)
    decodes = AttentionMetadata(slot_mapping=torch.zeros(3, dtype=torch.int64),
                                block_tables=tables[[0, 1, 7]], query_start_loc=[0, 1, 2, 3],
                                seq_lens=[40, 5, 90])
    rows = query[[starts[0], starts[1], starts[7]]]
    out = paged_attention(rows, k_cache, v_cache, decodes, scale, window)
    for j, i in enumerate((0, 1, 7)):
        length = shapes[i][1]
        k = k_cache[tables[i, : blocks_each[i]]].flatten(0, 1)[:length]
        v = v_cache[tables[i, : blocks_each[i]]].flatten(0, 1)[:length]
        want = dense_attention(rows[j : j + 1], k, v, scale, window)
        assert (out[j : j + 1].float() - want).abs().max().item() < tol


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 32), (2, 1, 256)])
def test_logits_match_transformers_past_the_window(heads, kv_heads, head_dim, tmp_path):
    """Whole, chunked, decoded token by token, and over a cached prefix: prompts of
    70 tokens against a window of 24. head_dim 256 is Gemma 3's own."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_gemma3(tmp_path / "gemma", num_attention_heads=heads,
                            num_key_value_heads=kv_heads, head_dim=head_dim)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = gemma_engine(path, tmp_path)
    ids = prompt(70)
    ref = hf_logits(hf, ids)
    for chunks in ([70], [5, 16, 1, 30, 18], [62] + [1] * 8):
        engine.reset_prefix_cache()
        _, ours = our_logits(engine, ids, chunks)
        assert (ours - ref).abs().max().item() < TOL, chunks
    # The first 64 tokens are cached now; a longer prompt reuses them.
    longer = ids + [7, 8, 9, 10, 11]
    cached, rest = our_logits(engine, longer, [100])
    assert cached == 64
    assert (rest - hf_logits(hf, longer)[cached:]).abs().max().item() < TOL


def hf_on_stored_weights(path, model):
    """transformers' model with our model's stored (quantized, or bf16) matmul weights,
    dequantized; the embedding table keeps its own precision, as ours does."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    state = hf.state_dict()
    with torch.no_grad():
        for name, layer in model.linear_layers().items():
            w = dequantize(layer.quantized, torch.float32)
            if name == "lm_head":  # untied from the table
                hf.lm_head.weight = torch.nn.Parameter(w)
                continue
            prefix, sub = name.split(".")[:2], name.split(".", 2)[2]
            p = ".".join(["model", *prefix]) + "."
            parts = {"self_attn.qkv_proj": [f"self_attn.{x}_proj" for x in "qkv"],
                     "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"]}.get(sub, [sub])
            names = [p + part + ".weight" for part in parts]
            for n, piece in zip(names, w.split([state[n].shape[0] for n in names]), strict=True):
                state[n].copy_(piece)
    return hf


@pytest.mark.parametrize("dtype,weight_dtype,sliding_window_kv", [
    ("float32", "bf16", True), ("float32", "int8", True), ("float32", "int4", True),
    ("bfloat16", "fp32", True), ("bfloat16", "int8", True), ("bfloat16", "int4", True),
    ("float32", "bf16", False), ("float32", "int4", False), ("bfloat16", "int8", False),
])
def test_every_weight_dtype_matches_transformers_on_the_same_weights(
        dtype, weight_dtype, sliding_window_kv, tiny_gemma3, gemma3_hf, tmp_path):
    """fp32 activations over stored weights equal transformers' on those weights
    dequantized (within TOL); bf16 activations stay within BF16_TOL of it in fp32.
    With window-aware KV (KV groups) and with every layer's KV kept whole."""
    # fp32 K/V under fp32 activations: the weights alone are compared here.
    engine = gemma_engine(tiny_gemma3, tmp_path, dtype=dtype, weight_dtype=weight_dtype,
                          sliding_window_kv=sliding_window_kv,
                          kv_dtype="float32" if dtype == "float32" else "auto")
    assert engine.runner.kv_groups.hybrid == sliding_window_kv
    model = engine.runner.model
    stored = weight_dtype != "fp32"
    hf = hf_on_stored_weights(tiny_gemma3, model) if stored else gemma3_hf
    ids = prompt(60, seed=4)
    ref = hf_logits(hf, ids)
    tol = TOL if dtype == "float32" else BF16_TOL
    for chunks in ([60], [52] + [1] * 8):
        engine.reset_prefix_cache()
        _, ours = our_logits(engine, ids, chunks)
        assert (ours - ref).abs().max().item() < tol, chunks
    # Decode steps ran as one C call in fp32, over KV groups or whole KV (the bf16 step
    # has no Gemma 3 layer).
    assert (model.decode_stack is not None) == (dtype == "float32" and runs_here(torch.float32))


@pytest.mark.parametrize("sliding_window_kv", [True, False])
def test_int8_kv_rows_decode_as_the_torch_forward_and_near_fp32_kv(
        sliding_window_kv, tiny_gemma3, tmp_path):
    """Over int8 K/V rows (an fp32 engine's default under int4 weights), the C decode
    step, sliding windows and KV groups included, gives the logits the torch forward
    gives over the same rows, and both stay near fp32 K/V's."""
    ids = prompt(60, seed=5)
    chunks = [40] + [1] * 20  # decodes past the window
    logits = {}
    for kv_dtype in ("auto", "float32"):
        engine = gemma_engine(tiny_gemma3, tmp_path, weight_dtype="int4", kv_dtype=kv_dtype,
                              sliding_window_kv=sliding_window_kv)
        _, logits[kv_dtype] = our_logits(engine, ids, chunks)
        if kv_dtype == "auto":
            assert engine.config.kv_dtype == "int8"
            model = engine.runner.model
            assert model.decode_stack is not None or not runs_here(torch.float32)
            engine.reset_prefix_cache()
            stack, model.decode_stack = model.decode_stack, None
            _, torch_only = our_logits(engine, ids, chunks)
            model.decode_stack = stack
            torch.testing.assert_close(logits["auto"], torch_only, rtol=0, atol=1e-2)
    assert (logits["auto"] - logits["float32"]).abs().max().item() < 0.1


PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def test_greedy_generation_matches_transformers_with_the_cache_on_and_off(
        tiny_gemma3, gemma3_hf, tmp_path):
    prompts = [rand_ids(30 + 9 * i, 200 + i) for i in range(4)]
    engine = gemma_engine(tiny_gemma3, tmp_path, num_blocks=128)
    first = [o[0].token_ids for o in engine.generate(prompts, PARAMS)]
    second = engine.generate(prompts, PARAMS)  # every prompt's full blocks now hit
    assert all(o[0].cached_tokens >= 16 for o in second)
    assert [o[0].token_ids for o in second] == first
    no_cache = gemma_engine(tiny_gemma3, tmp_path, num_blocks=128, enable_prefix_caching=False)
    assert [o[0].token_ids for o in no_cache.generate(prompts, PARAMS)] == first
    for ids, ours in zip(prompts, first, strict=True):
        with torch.no_grad():
            g = gemma3_hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
        assert g[0, len(ids):].tolist() == ours


def test_preempted_requests_and_salted_tenants_keep_their_greedy_output(tiny_gemma3, tmp_path):
    prompts = [rand_ids(40 + 7 * i, 100 + i) for i in range(6)]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    roomy = gemma_engine(tiny_gemma3, tmp_path, num_blocks=256)
    expected = [o[0].token_ids for o in roomy.generate(prompts, params)]
    tight = gemma_engine(tiny_gemma3, tmp_path, num_blocks=20, max_num_batched_tokens=64)
    assert [o[0].token_ids for o in tight.generate(prompts, params)] == expected
    assert tight.metrics_snapshot()["preemptions"] > 0

    [[a]] = roomy.generate([prompts[5]], params, cache_salt="tenant-a")
    [[b]] = roomy.generate([prompts[5]], params, cache_salt="tenant-b")
    [[c]] = roomy.generate([prompts[5]], params, cache_salt="tenant-a")
    assert (a.cached_tokens, b.cached_tokens, c.cached_tokens) == (0, 0, 64)
    assert a.token_ids == b.token_ids == c.token_ids == expected[5]


def test_a_multimodal_gemma3_checkpoint_runs_its_language_model():
    """A gemma3 config computes its text_config's decoder from the checkpoint's
    language-model weights (the vision tower's are left out)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from inference.model_runner import ModelRunner
    from inference.sequence import Sequence

    text = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                query_pre_attn_scalar=32)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=1,
                          boi_token_index=509, eoi_token_index=510, image_token_index=511)
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    runner = ModelRunner(EngineConfig(dtype="float32", weight_dtype="fp32", num_blocks=8,
                                      block_size=4, sliding_window_kv=False),
                         config, hf.state_dict())
    assert isinstance(runner.model, Gemma3ForCausalLM)
    assert runner.kv_cache.shape == (2, 3, 8, 4, 2, 32)
    ids = list(range(3, 30))  # past the window of 8
    seq = Sequence("mm", 0, ids, SamplingParams())
    seq.block_table = list(range(8))
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0]
    assert (runner.full_logits([seq], [len(ids)]) - ref).abs().max().item() < TOL


def test_the_bf16_decode_step_refuses_gemma3_layers():
    """Windows, output norms and gelu-tanh are the fp32 step's; a bf16 Gemma 3 engine
    decodes with the torch forward."""
    from kernels.decode_stack import DecodeStack, StackLayer

    def w(out: int, inp: int) -> torch.Tensor:
        return torch.zeros(out, inp, dtype=torch.bfloat16)

    norm = torch.ones(64, dtype=torch.bfloat16)
    plain = dict(input_norm=norm, post_norm=norm, qkv=w(128, 64), o=w(64, 64),
                 gate_up=w(128, 64), down=w(64, 64))
    DecodeStack([StackLayer(**plain)], norm, 4, 2, 16, 1e-6)  # the Llama layer: taken
    for gemma in (dict(window=8), dict(attn_out_norm=norm), dict(rope=1)):
        with pytest.raises(ValueError, match="fp32 step"):
            DecodeStack([StackLayer(**plain, **gemma)], norm, 4, 2, 16, 1e-6)
    with pytest.raises(ValueError, match="gelu_tanh"):
        DecodeStack([StackLayer(**plain)], norm, 4, 2, 16, 1e-6, act="gelu_tanh")
