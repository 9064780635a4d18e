"""Quantize a model's linear layers once at load, and keep the result on disk.

Quantizing SmolLM2's 135M weights takes seconds; reading them back from a
safetensors file beside the converted model takes a fraction of one. A file whose
format, weight dtype or tensors do not match what the model expects (another
version, a half-written or corrupt file) is ignored and rebuilt.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from inference.loader import quantized_cache_path, resolve_model_path
from kernels.quant_layout import stored_layout
from kernels.quant_linear import QuantizedWeight, quantize

log = logging.getLogger(__name__)

# Bump when the stored layout changes (kernels/quant_linear's docstring describes it).
FORMAT_VERSION = 4
FORMAT_NAME = "prefixchat-quantized-linear"
# The weight dtypes (inference.config) stored apart from the compute dtype.
QUANTIZED_DTYPES = ("int8", "int4", "bf16")


def layer_kind(name: str, kind: str) -> str:
    """The format (kernels.quant_linear's kinds) a layer gets under the model's weight
    dtype. The output head is int8 (Q8_0's grid) under both: its error moves every
    logit directly (int4 there took the held text's KL from bf16 from 0.003 to 0.05
    nats a token on SmolLM2), and GGUF files keep it at 6 or 8 bits, so llama.cpp's
    Q4_1 reads the same bytes. The other layers take int4, or under int8 the 8-bit grid
    with an offset (uint8): it holds SmolLM2's shipped Q4_1 layers on their levels,
    where Q8_0's symmetric grid moved them (the held text's KL from bf16: 0.0034 nats a
    token)."""
    if kind == "bf16":  # bf16 storage for an fp32 model, the head as well
        return kind
    if name == "lm_head":
        return "int8"
    return "uint8" if kind == "int8" else kind


def load_cached(path: Path, layers: dict, kind: str) -> dict[str, QuantizedWeight]:
    """Every layer's quantized weight from the file; ValueError if it does not fit."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        want = {"format": FORMAT_NAME, "version": str(FORMAT_VERSION), "weight_dtype": kind}
        if any(meta.get(k) != v for k, v in want.items()):
            raise ValueError(f"metadata {meta} is not {want}")
        out = {}
        for name, layer in layers.items():
            parts = {}
            layout = stored_layout(layer_kind(name, kind), layer.out_features, layer.in_features)
            for part, (dtype, shape) in layout.items():
                t = f.get_tensor(f"{name}.{part}")
                if t.dtype != dtype or tuple(t.shape) != shape:
                    raise ValueError(f"{name}.{part} is {t.dtype} {tuple(t.shape)}, not {dtype} {shape}")
                parts[part] = t.contiguous()
            out[name] = QuantizedWeight(layer_kind(name, kind), parts["data"], parts["scale"],
                                        layer.in_features)
    return out


def save_cached(path: Path, weights: dict[str, QuantizedWeight], kind: str) -> None:
    tensors = {}
    for name, qw in weights.items():
        tensors[f"{name}.data"] = qw.data.cpu().contiguous()
        tensors[f"{name}.scale"] = qw.scale.cpu().contiguous()
    meta = {"format": FORMAT_NAME, "version": str(FORMAT_VERSION), "weight_dtype": kind}
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside its name and renamed: a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def quantized_cache_file(config) -> Path:
    """The cache file for an EngineConfig's model and weight dtype."""
    path = resolve_model_path(config.model, config.model_cache_dir)
    return quantized_cache_path(path, config.weight_dtype, FORMAT_VERSION, config.model_cache_dir)


def cached_weights(model, kind: str, cache_file: Path | None) -> dict[str, QuantizedWeight] | None:
    """The quantized weights of `model`'s linear layers (see LlamaForCausalLM.linear_layers)
    that cache_file holds, or None where it holds none that fit (no file, another
    format, a corrupt one: quantize_model then rebuilds it). Only the layers' shapes
    are read, so their weights need not be loaded yet."""
    if cache_file is None or not cache_file.exists():
        return None
    if kind not in QUANTIZED_DTYPES:
        raise ValueError(f"unknown weight dtype {kind!r}; expected one of {QUANTIZED_DTYPES}")
    layers = model.linear_layers()
    device = next(iter(layers.values())).weight.device
    try:
        return {n: qw.to(device) for n, qw in load_cached(cache_file, layers, kind).items()}
    except Exception as exc:  # any unreadable or foreign file: rebuild it
        log.warning("ignoring the quantized-weight cache %s: %s", cache_file, exc)
        return None


def quantize_model(model, kind: str, cache_file: Path | None = None,
                   cached: dict[str, QuantizedWeight] | None = None) -> bool:
    """Give every linear layer of `model` a quantized copy of its weight: `cached` (what
    cached_weights read from cache_file), or else quantized from the layer's weight and
    written to cache_file; True when the cache held them. Call it before casting the
    model to its compute dtype, so the weights are quantized from full precision."""
    if kind not in QUANTIZED_DTYPES:
        raise ValueError(f"unknown weight dtype {kind!r}; expected one of {QUANTIZED_DTYPES}")
    layers = model.linear_layers()
    weights = cached
    hit = weights is not None
    if weights is None:
        weights = {name: quantize(layer.weight, layer_kind(name, kind))
                   for name, layer in layers.items()}
        if cache_file is not None:
            try:
                save_cached(cache_file, weights, kind)
            except OSError as exc:  # a read-only cache: quantize again next time
                log.warning("could not write the quantized-weight cache %s: %s", cache_file, exc)
    for name, layer in layers.items():
        layer.set_quantized(weights[name])
    log.info("linear weights quantized to %s (%s)", kind, "cached" if hit else "built")
    return hit
