"""The service's engine settings reach EngineConfig: what an operator sets in the
environment is what the engine loads with."""

from __future__ import annotations

from chatapp.generation.embedded import engine_config


def test_weight_dtype_and_packing_reach_the_engine(settings):
    settings.LLM_WEIGHT_DTYPE = "int8"
    settings.LLM_PACK_WEIGHTS = True
    config = engine_config()
    assert (config.weight_dtype, config.pack_weights) == ("int8", True)
    # LLM_PACK_WEIGHTS=0: no packed copies (a quantized model keeps only its quantized weights).
    settings.LLM_PACK_WEIGHTS = False
    assert engine_config().pack_weights is False


def test_the_kv_dtype_reaches_the_engine(settings):
    settings.LLM_DTYPE = "float32"  # fp32 K/V under fp32 compute, on any host
    settings.LLM_KV_DTYPE = "float32"
    assert engine_config().kv_dtype == "float32"
    settings.LLM_KV_DTYPE = None  # unset: the engine's own choice
    from inference import EngineConfig

    assert engine_config().kv_dtype == EngineConfig().kv_dtype == "auto"


def test_unset_sizes_leave_the_engines_defaults(settings):
    from inference import EngineConfig

    settings.LLM_WEIGHT_DTYPE = None
    settings.LLM_NUM_BLOCKS = None
    config, default = engine_config(), EngineConfig()
    assert config.weight_dtype == default.weight_dtype
    assert config.num_blocks == default.num_blocks
    assert config.pack_weights is True
