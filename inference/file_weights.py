"""A GGUF model's matmul weights as the engine stores them, taken from the file.

The first start builds each layer from the file's blocks (inference/gguf_weights.py),
one layer at a time, and writes the result to a cache file in the model cache; later
starts map that file (torch.load with mmap), so they read nothing until the first
step touches a weight, and the pages stay the kernel's to drop and read again, as a
mapped GGUF file's are. A cache file that does not fit what the model expects
(another version, another file, a half-written one) is ignored and rebuilt.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import torch

from inference.gguf_checkpoint import BlockEmbedding, GGUFCheckpoint
from inference.gguf_weights import EXACT_TYPES, NATIVE_KINDS, stored_weight
from inference.quantize import layer_kind
from kernels.quant_layout import stored_layout
from kernels.quant_linear import QuantizedWeight

log = logging.getLogger(__name__)

# Bump when what the cache holds changes.
FORMAT_VERSION = 1
FORMAT_NAME = "prefixchat-file-weights"


def cache_path(source: Path, weight_dtype: str, cache_dir: Path) -> Path:
    """Where the stored weights of a GGUF file live: named by the file, its size and
    time, the weight dtype and the format version (a changed file never matches)."""
    st = source.stat()
    tag = f"{st.st_size:x}-{st.st_mtime_ns:x}"
    return cache_dir / f"{source.stem}.{weight_dtype}-f{FORMAT_VERSION}-{tag}.pt"


def _load_cache(path: Path, model, kind: str) -> tuple[dict[str, QuantizedWeight], set[str]] | None:
    """The cached weights and the names of the layers that hold the file's blocks, or
    None where the file is missing or does not fit the model."""
    if not path.exists():
        return None
    try:
        saved = torch.load(path, mmap=True, weights_only=True)
        meta = saved["meta"]
        if (meta.get("format"), meta.get("version"), meta.get("weight_dtype")) != (
                FORMAT_NAME, FORMAT_VERSION, kind):
            raise ValueError(f"metadata {meta} is not this version's")
        out = {}
        for name, layer in model.linear_layers().items():
            entry = saved["weights"][name]
            layout = stored_layout(entry["kind"], layer.out_features, layer.in_features)
            for part in ("data", "scale"):
                dtype, shape = layout[part]
                t = entry[part]
                if t.dtype != dtype or tuple(t.shape) != shape:
                    raise ValueError(f"{name}.{part} is {t.dtype} {tuple(t.shape)}")
            out[name] = QuantizedWeight(entry["kind"], entry["data"], entry["scale"],
                                        layer.in_features)
        return out, set(saved["native"])
    except Exception as exc:  # any unreadable or foreign file: rebuild it
        log.warning("ignoring the weight cache %s: %s", path, exc)
        return None


def _save_cache(path: Path, weights: dict[str, QuantizedWeight], native: set[str],
                kind: str) -> None:
    payload = {
        "meta": {"format": FORMAT_NAME, "version": FORMAT_VERSION, "weight_dtype": kind},
        "weights": {n: {"kind": qw.kind, "data": qw.data, "scale": qw.scale}
                    for n, qw in weights.items()},
        "native": sorted(native),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside its name and renamed: a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(model, checkpoint: GGUFCheckpoint, kind: str) -> tuple[dict[str, QuantizedWeight], set[str]]:
    """Every matmul layer of `model` from the file, and which hold its blocks in all
    their rows."""
    sources = model.checkpoint_sources()
    weights, native = {}, set()
    for name in model.linear_layers():
        parts = [checkpoint.tensor(n) for n in sources[name]]
        weights[name], on_blocks = stored_weight(parts, layer_kind(name, kind))
        if on_blocks == weights[name].out_features:
            native.add(name)
    return weights, native


def _stored(model, checkpoint: GGUFCheckpoint, kind: str, path: Path | None
            ) -> tuple[dict[str, QuantizedWeight], set[str], bool]:
    """The stored matmuls from the cache file at path, else built from the file and
    written there; and whether the cache held them."""
    cached = None if path is None else _load_cache(path, model, kind)
    if cached is not None:
        return *cached, True
    weights, native = build(model, checkpoint, kind)
    if path is not None:
        try:
            _save_cache(path, weights, native, kind)
        except OSError as exc:  # a read-only cache: build again next time
            log.warning("could not write the weight cache %s: %s", path, exc)
    return weights, native, False


def load(model, checkpoint: GGUFCheckpoint, kind: str, cache_dir: Path | None) -> bool:
    """Give `model` its weights from the GGUF file: the matmuls stored as `kind`
    (inference.quantize.layer_kind per layer, or 8 bits where the file has more),
    norms and biases dequantized, token embeddings looked up in the file's rows. True
    when the cache held the matmuls."""
    started = time.perf_counter()
    path = None if cache_dir is None else cache_path(checkpoint.path, kind, cache_dir)
    weights, native, cached = _stored(model, checkpoint, kind, path)
    model.load_hf_state_dict(checkpoint, linear=False, embedding=False)
    for name, layer in model.linear_layers().items():
        layer.set_quantized(weights[name])
    table = checkpoint.tensor("model.embed_tokens.weight")
    head = model.lm_head.quantized
    if (model.tie_word_embeddings and "lm_head" in native and table.qtype in EXACT_TYPES
            and head.kind in NATIVE_KINDS[table.qtype]):
        model.use_head_embedding()  # the head's rows are the file's table, exactly
    else:
        model.embed_tokens = BlockEmbedding(table, model.embed_tokens.weight.dtype)
    total = sum(qw.out_features for qw in weights.values())
    on_blocks = sum(weights[n].out_features for n in native)
    log.info("weights from %s: %d of %d matmul rows on the file's blocks, %.0f MiB stored, "
             "%s in %.1f s", checkpoint.path.name, on_blocks, total,
             sum(qw.nbytes for qw in weights.values()) / 2**20,
             "mapped from the cache" if cached else "built", time.perf_counter() - started)
    return cached


def prepare(model: str, weight_dtype: str | None, cache_dir: str | None) -> Path | None:
    """Store a GGUF model's weights in the model cache ahead of its engines (docker's
    init), so that processes starting together do not each build them; the cache
    file, or None where the model is no GGUF file or keeps no stored kind."""
    from inference.loader import (
        auto_weight_dtype,
        load_weights,
        model_cache_dir,
        resolve_model_path,
    )
    from inference.models.registry import build_model

    path = resolve_model_path(model, cache_dir)
    kind = weight_dtype or "auto"
    if kind == "auto":
        kind = auto_weight_dtype(model, path, cache_dir)
    loaded = load_weights(path)
    if kind not in ("int8", "int4") or not isinstance(loaded.state_dict, GGUFCheckpoint):
        return None
    checkpoint = loaded.state_dict
    target = cache_path(checkpoint.path, kind, model_cache_dir(cache_dir))
    with torch.device("cpu"):
        skeleton = build_model(loaded.config)
    try:
        _stored(skeleton, checkpoint, kind, target)
    finally:
        checkpoint.close()
    return target
