"""Engine fixtures: tiny random models for fast tests, the real SmolLM2 where it matters."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from inference import EngineConfig, LLMEngine
from inference.loader import reference_model, resolve_model_path
from kernels import f32_kernels
from kernels.quant_layout import QUANT_KINDS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


def make_tiny_model(dest: Path, model_type: str = "llama", seed: int = 0, tied: bool = True,
                    norm_std: float = 0.0, **extra) -> Path:
    """A 2-layer random model with SmolLM2's tokenizer (so text round-trips); `extra`
    goes to the config (Qwen3's head_dim, a rope scaling, Gemma 3's layer types, ...).
    norm_std > 0 draws the norms' weights too (around their init)."""
    from transformers import (
        AutoModelForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        Qwen2Config,
        Qwen3Config,
    )

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config,
           "gemma3_text": Gemma3TextConfig}[model_type]
    fields = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = cls(**(fields | extra))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Larger weights than the default init make logits sharp enough to be meaningful.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            elif "bias" in [n for n, q in model.named_parameters() if q is p][0]:
                p.normal_(0, 0.05)
            elif norm_std:
                p.add_(torch.randn_like(p), alpha=norm_std)
    model.save_pretrained(dest)
    src = resolve_model_path()
    for name in TOKENIZER_FILES:
        if (src / name).exists() and name != "generation_config.json":
            shutil.copy(src / name, dest / name)
    return dest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


def weight_dtype_under_test() -> str | None:
    """$PREFIXCHAT_TEST_WEIGHT_DTYPE (bf16, int8, int4): the engine tests' weight dtype;
    unset, engines keep their weights in the compute dtype."""
    return os.environ.get("PREFIXCHAT_TEST_WEIGHT_DTYPE") or None


def decode_rows_round_to_int16(engine: LLMEngine) -> bool:
    """True where the engine's decode rows take the fp32 kernels' integer dots: an fp32
    engine on the CPU over quantized linear weights, on a build that has them."""
    return (engine.config.dtype == "float32" and engine.config.weight_dtype in QUANT_KINDS
            and f32_kernels.int_dots())


def pytest_collection_modifyitems(items) -> None:
    """Mark the tests whose engines take $PREFIXCHAT_TEST_WEIGHT_DTYPE, so a rerun with
    other weights (.ci/run) selects just those (`-m weight_dtype`)."""
    for item in items:
        if "make_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.weight_dtype)


@pytest.fixture
def make_engine(tiny_model, tmp_path_factory):
    """Build an fp32 engine on the tiny model; keyword arguments go to EngineConfig.
    Its linear weights are quantized as $PREFIXCHAT_TEST_WEIGHT_DTYPE says, if set."""

    def build(**kw) -> LLMEngine:
        kw.setdefault("model", str(tiny_model))
        kw.setdefault("dtype", "float32")
        kw.setdefault("num_blocks", 256)
        if weight_dtype := weight_dtype_under_test():
            kw.setdefault("weight_dtype", weight_dtype)
            # Quantized copies of throwaway models stay out of the user's cache.
            kw.setdefault("model_cache_dir", str(tmp_path_factory.mktemp("quantized")))
        return LLMEngine(EngineConfig(**kw))

    return build


@pytest.fixture(scope="session")
def smollm2_engine() -> LLMEngine:
    """The shipped SmolLM2 in fp32 over its exact (int4) weights, with fp32 K/V: what
    transformers computes on the same weights (a bf16 cache is held to it apart)."""
    return LLMEngine(EngineConfig(dtype="float32", num_blocks=1024, max_num_batched_tokens=1024,
                                  kv_dtype="float32"))


@pytest.fixture(scope="session")
def smollm2_hf():
    return reference_model(dtype=torch.float32)


@pytest.fixture
def one_thread():
    """One torch thread for the test: on a busy shared machine every multi-threaded op
    waits for a descheduled OpenMP worker (milliseconds per op)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
