"""The embedded engines: one AsyncEngine per served model in this process, shared by
every consumer (the models: chatapp.generation.served_models).

Loading a model takes seconds, so it happens once, behind a lock, in whichever thread
asks first (the ASGI app starts every model in the background at import when
LLM_PRELOAD is on, so the first message does not wait for it). Each engine has its own
KV pool, so its own prefix cache: a request to one model never meets another's blocks.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading

from django.conf import settings

from chatapp.generation import served_models
from chatapp.generation.served_models import UnknownModel

log = logging.getLogger(__name__)

_engines: dict[str, object] = {}  # alias -> AsyncEngine
_tokenizers: dict[str, object] = {}  # alias -> tokenizer loaded before its engine
_lock = threading.Lock()
_import_lock = threading.Lock()


def import_engine_package() -> None:
    """Import the engine package (inference) from one thread at a time: two threads'
    first imports of it meet half-initialized modules (the package imports the engine,
    whose loader imports the package back), as the preload thread and a request's
    would. Cheap once done."""
    with _import_lock:
        import inference  # noqa: F401


def engine_config(model: str | None = None):
    """The EngineConfig of model `model` (an alias; None: the default). With several
    models, the process's KV budgets are split evenly between them and each keeps its
    disk tier in a folder of its own."""
    from inference import EngineConfig

    spec = served_models.resolve(model)
    n = len(served_models.specs())
    kv_dir = settings.LLM_KV_DIR
    if kv_dir and served_models.several():
        kv_dir = os.path.join(kv_dir, spec.alias)
    # Unset sizes (None) leave EngineConfig's defaults.
    sizes = {"num_blocks": served_models.share(settings.LLM_NUM_BLOCKS, n),
             # Unset, the engine's default budget is the process's, split like a set one.
             "kv_cache_memory_bytes": served_models.share(
                 settings.LLM_KV_CACHE_BYTES or EngineConfig.kv_cache_memory_bytes, n),
             "max_num_seqs": settings.LLM_MAX_NUM_SEQS,
             "max_model_len": settings.LLM_MAX_MODEL_LEN,
             "weight_dtype": spec.weight_dtype or settings.LLM_WEIGHT_DTYPE,
             "kv_dtype": settings.LLM_KV_DTYPE,
             "kv_offload_bytes": served_models.share(settings.LLM_KV_OFFLOAD_BYTES, n),
             "kv_dir": kv_dir}
    return EngineConfig(
        model=spec.model, device=settings.LLM_DEVICE, dtype=settings.LLM_DTYPE,
        block_size=settings.LLM_BLOCK_SIZE, model_cache_dir=settings.LLM_MODEL_CACHE,
        engine_id=served_models.engine_id_for(spec.alias), pack_weights=settings.LLM_PACK_WEIGHTS,
        **{k: v for k, v in sizes.items() if v},
    )


def get_engine(model: str | None = None):
    """The engine of model `model` (an alias; None or "": the default), created on first
    use (blocking: call from a thread in async code). UnknownModel for a name not served."""
    alias = served_models.resolve(model).alias
    engine = _engines.get(alias)
    if engine is None:
        import_engine_package()
        with _lock:
            engine = _engines.get(alias)
            if engine is None:
                from inference import AsyncEngine

                config = engine_config(alias)
                log.info("Loading model %s (%s) on %s (%s)...", alias, config.model,
                         config.device, config.dtype)
                # The tokenizer loaded already (get_tokenizer) is kept: one per model. The
                # model loads on the engine's step thread (AsyncEngine: one OpenMP pool).
                engine = AsyncEngine(config, tokenizer=_tokenizers.get(alias))
                _engines[alias] = engine
                # On a clean exit the engine keeps what its pool holds in LLM_KV_DIR.
                atexit.register(engine.shutdown)
                log.info("Model %s loaded.", alias)
    return engine


def get_tokenizer(model: str | None = None):
    """The tokenizer of model `model`, without loading the model when its engine is not
    loaded (a web process whose generations all run on workers still builds their prompts)."""
    spec = served_models.resolve(model)
    engine = _engines.get(spec.alias)
    if engine is not None:
        return engine.tokenizer
    import_engine_package()
    with _lock:
        engine = _engines.get(spec.alias)
        if engine is not None:
            return engine.tokenizer
        if spec.alias not in _tokenizers:
            from inference.loader import load_tokenizer

            _tokenizers[spec.alias] = load_tokenizer(spec.model, settings.LLM_MODEL_CACHE)
        return _tokenizers[spec.alias]


async def aget_tokenizer(model: str | None = None):
    engine = loaded_engine(model)
    if engine is not None:
        return engine.tokenizer
    return await asyncio.to_thread(get_tokenizer, model)


def loaded_engine(model: str | None = None):
    """The engine of model `model` if this process has loaded it, else None (never starts
    a load; None too for a name not served)."""
    try:
        return _engines.get(served_models.resolve(model).alias)
    except UnknownModel:
        return None


def loaded_engines() -> dict[str, object]:
    """alias -> engine, for every model this process has loaded (in LLM_MODELS order)."""
    engines = dict(_engines)
    order = {alias: i for i, alias in enumerate(served_models.aliases())}
    return dict(sorted(engines.items(), key=lambda kv: order.get(kv[0], len(order))))


async def aget_engine(model: str | None = None):
    """get_engine() without blocking the event loop while the model loads."""
    engine = loaded_engine(model)
    if engine is not None:
        return engine
    return await asyncio.to_thread(get_engine, model)


def preload_in_background() -> None:
    """Start loading every model now, one after the other in a daemon thread; errors
    surface on first use."""

    def load() -> None:
        for alias in served_models.aliases():
            try:
                get_engine(alias)
            except Exception:
                log.exception("Preloading model %s failed; its first message will retry.", alias)

    threading.Thread(target=load, name="engine-preload", daemon=True).start()
