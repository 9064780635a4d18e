"""Which model class computes a transformers config: the registry ModelRunner reads."""

from __future__ import annotations

from torch import nn

from inference.models.gemma3 import Gemma3ForCausalLM
from inference.models.llama import LlamaForCausalLM

# The text decoder's model_type -> its class.
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
}


def text_config(config):
    """The text decoder's config: a multimodal config's text part (gemma3's
    text_config), else the config itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def model_class(config) -> type[nn.Module]:
    """The class for a config (or a multimodal config's text part); ValueError for an
    architecture the engine does not compute."""
    kind = text_config(config).model_type
    if kind not in MODEL_CLASSES:
        raise ValueError(f"architecture {kind!r} is not supported "
                         f"(supported: {', '.join(MODEL_CLASSES)})")
    return MODEL_CLASSES[kind]


def build_model(config) -> nn.Module:
    """An uninitialised model for the config, on the current default device."""
    return model_class(config)(text_config(config))
