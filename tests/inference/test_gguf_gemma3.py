"""The real Gemma 3 270M Q4_K_M GGUF (`make install-gemma3`): its config and tokenizer,
the engine's reading of its tensors (inference.gguf_checkpoint), and its rows on our
grids. Skipped where the package is absent."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from inference import gguf_weights as gw
from inference.gguf_checkpoint import GGUFCheckpoint
from inference.gguf_file import GGUFFile
from inference.loader import (
    auto_weight_dtype,
    gemma3_gguf_path,
    load_config,
    load_tokenizer,
    reference_model,
    resolve_model_path,
)
from kernels.quant_linear import dequantize

GGUF = gemma3_gguf_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="needs the Gemma 3 GGUF: make install-gemma3")
NAME = "gemma3-270m"


@pytest.fixture(scope="module")
def folder():
    return resolve_model_path(NAME)


@pytest.fixture(scope="module")
def gguf_tensors():
    return {t.name: t for t in GGUFFile(GGUF).tensors}


@pytest.fixture(scope="module")
def checkpoint(folder):
    return GGUFCheckpoint(GGUF, load_config(folder))


def converted(checkpoint, name: str) -> torch.Tensor:
    return checkpoint[name]


def test_its_tensor_types_and_what_auto_makes_of_them(gguf_tensors):
    """Q4_K_M keeps Q4_K for attn_output and half of ffn_down, Q6_K for the other half;
    its 640-column matrices (no multiple of 256) fall back to Q5_0, attn_v and the tied
    embedding are Q8_0. Q5_0 is the most common: auto takes int8 (uint8 layers, int8 head)."""
    matrices = Counter(t.tensor_type.name for n, t in gguf_tensors.items()
                       if n.startswith("blk.") and len(t.shape) == 2)
    assert matrices == {"Q5_0": 81, "Q4_K": 27, "Q8_0": 9, "Q6_K": 9}
    assert gguf_tensors["token_embd.weight"].tensor_type.name == "Q8_0"
    assert "output.weight" not in gguf_tensors  # tied head
    assert auto_weight_dtype(NAME) == "int8"


def test_the_conversion_is_a_gemma3_text_model_with_its_tokenizer(folder):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    assert config.model_type in ("gemma3", "gemma3_text")
    assert config.sliding_window == 512 and config.head_dim == 256
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert config.tie_word_embeddings and config.vocab_size == 262144
    assert config.eos_token_id == [1, 106]  # <eos>, and <end_of_turn> ends a reply
    tok = load_tokenizer(NAME)
    assert tok.bos_token == "<bos>" and tok.chat_template
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[:2] == [tok.bos_token_id, tok.convert_tokens_to_ids("<start_of_turn>")]


@pytest.mark.parametrize("hf, gguf_name", [
    ("model.embed_tokens.weight", "token_embd.weight"),  # Q8_0
    ("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight"),  # Q5_0
    ("model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight"),  # Q4_K
    ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),  # Q6_K
])
def test_read_matrices_are_ggufs_dequantization(checkpoint, gguf_tensors, hf, gguf_name):
    want = gw.dequantize_tensor(gguf_tensors[gguf_name])
    assert np.array_equal(converted(checkpoint, hf).numpy(), want)


def test_norm_weights_lose_the_ggufs_plus_one(checkpoint, gguf_tensors):
    """llama.cpp stores Gemma's RMSNorm weights as 1 + w (its graph multiplies by them);
    transformers' Gemma3RMSNorm multiplies by 1 + w, so the conversion subtracts 1."""
    pairs = [("model.norm.weight", "output_norm.weight"),
             ("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"),
             ("model.layers.0.self_attn.q_norm.weight", "blk.0.attn_q_norm.weight"),
             ("model.layers.0.post_feedforward_layernorm.weight", "blk.0.post_ffw_norm.weight")]
    for hf, name in pairs:
        raw = torch.from_numpy(gw.dequantize_tensor(gguf_tensors[name]).reshape(-1))
        assert torch.equal(converted(checkpoint, hf), raw - 1), hf
        assert abs(converted(checkpoint, hf).mean() - (raw.mean() - 1)) < 1e-4


def test_the_engine_on_the_file_knows_paris(engine):
    """The shift checked end to end: with the norms right the model knows the answer
    (with 1 + w stored as w it babbles)."""
    from tests.inference.test_parity import our_logits

    tok = engine.tokenizer
    ids = tok("The capital of France is").input_ids
    engine.reset_prefix_cache()
    _, logits = our_logits(engine, ids, [len(ids)])
    assert tok.convert_tokens_to_ids("▁Paris") in logits[-1].topk(5).indices.tolist()


def test_its_rows_land_on_our_grids(checkpoint, gguf_tensors):
    """q (Q5_0), k (Q5_0) and v (Q8_0) fused as the engine fuses them go to uint8, the
    Q5_0 rows bit for bit; o (Q4_K) to int4 within the fp16 rounding of its scales."""
    parts = [checkpoint.tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv"]
    qkv = torch.cat([converted(checkpoint, f"model.layers.0.self_attn.{p}_proj.weight")
                     for p in "qkv"])
    qw, native = gw.stored_weight(parts, "uint8")
    assert qw.kind == "uint8" and native == qkv.shape[0]
    got = dequantize(qw)
    q_rows = gguf_tensors["blk.0.attn_q.weight"].shape[1]
    assert torch.equal(got[:q_rows], qkv[:q_rows])
    assert bool(((got - qkv).abs() <= gw.rounding_bound(qw)).all())
    o = converted(checkpoint, "model.layers.0.self_attn.o_proj.weight")
    qw, native = gw.stored_weight([checkpoint.tensor("model.layers.0.self_attn.o_proj.weight")],
                                  "int4")
    assert qw.kind == "int4" and native == o.shape[0]
    assert bool(((dequantize(qw) - o).abs() <= gw.rounding_bound(qw)).all())


@pytest.fixture(scope="module")
def engine():
    from inference import EngineConfig, LLMEngine

    # fp32 weights: the file's values, which transformers reads too.
    return LLMEngine(EngineConfig(model=NAME, dtype="float32", weight_dtype="fp32",
                                  num_blocks=256, max_model_len=2048))


def test_the_engine_s_logits_match_transformers_on_the_same_weights(engine):
    """Past the 512-token sliding window, whole and over a cached prefix (a difference
    of about 3e-4 measured; the bound leaves room for other kernel paths)."""
    from tests.inference.test_parity import hf_logits, our_logits

    hf = reference_model(NAME)
    text = "The lighthouse keeper counted the ships that passed each night. " * 60
    ids = engine.tokenizer.encode(text)[:600]
    assert len(ids) == 600
    ref = hf_logits(hf, ids)
    engine.reset_prefix_cache()
    _, whole = our_logits(engine, ids, [256, 256, 88])
    assert (whole - ref).abs().max().item() < 1e-2
    cached, rest = our_logits(engine, ids + engine.tokenizer.encode(" Then"), [64])
    assert cached == 592
    ref2 = hf_logits(hf, ids + engine.tokenizer.encode(" Then"))
    assert (rest - ref2[cached:]).abs().max().item() < 1e-2
    assert torch.equal(rest.argmax(-1), ref2[cached:].argmax(-1))


def test_a_shared_system_prompt_is_served_from_the_cache(engine):
    from inference import SamplingParams

    system = "You are a careful assistant who answers in one short sentence. " * 12
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    engine.reset_prefix_cache()
    first = engine.generate([system + "Name a colour."], greedy)[0][0]
    second = engine.generate([system + "Name a fruit."], greedy)[0][0]
    prompt = len(engine.encode(system + "Name a fruit."))
    assert first.cached_tokens == 0
    assert second.cached_tokens >= prompt - 3 * engine.config.block_size
