"""The embedded engine: one AsyncEngine per process, shared by every consumer.

Loading the model takes seconds, so it happens once, behind a lock, in whichever
thread asks first (the ASGI app starts it in the background at import when
LLM_PRELOAD is on, so the first message does not wait for it).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading

from django.conf import settings

log = logging.getLogger(__name__)

_engine = None
_lock = threading.Lock()
_tokenizer = None


def engine_config():
    from inference import EngineConfig

    # Unset sizes (None) leave EngineConfig's defaults.
    sizes = {"num_blocks": settings.LLM_NUM_BLOCKS, "max_num_seqs": settings.LLM_MAX_NUM_SEQS,
             "max_model_len": settings.LLM_MAX_MODEL_LEN, "weight_dtype": settings.LLM_WEIGHT_DTYPE,
             "kv_offload_bytes": settings.LLM_KV_OFFLOAD_BYTES, "kv_dir": settings.LLM_KV_DIR}
    return EngineConfig(
        model=settings.LLM_MODEL, device=settings.LLM_DEVICE, dtype=settings.LLM_DTYPE,
        block_size=settings.LLM_BLOCK_SIZE, model_cache_dir=settings.LLM_MODEL_CACHE,
        engine_id=settings.LLM_ENGINE_ID, pack_weights=settings.LLM_PACK_WEIGHTS,
        **{k: v for k, v in sizes.items() if v},
    )


def get_engine():
    """This process's engine, created on first use (blocking: call from a thread in async code)."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                from inference import AsyncEngine, LLMEngine

                config = engine_config()
                log.info("Loading model %s on %s (%s)...", config.model, config.device, config.dtype)
                # The tokenizer loaded already (get_tokenizer) is kept: one per process.
                _engine = AsyncEngine(engine=LLMEngine(config, tokenizer=_tokenizer))
                # On a clean exit the engine keeps what its pool holds in LLM_KV_DIR.
                atexit.register(_engine.shutdown)
                log.info("Model loaded.")
    return _engine


def get_tokenizer():
    """The process's tokenizer, without loading the model when the engine is not loaded
    (a web process whose generations all run on workers still builds their prompts)."""
    global _tokenizer
    if _engine is not None:
        return _engine.tokenizer
    with _lock:
        if _engine is not None:
            return _engine.tokenizer
        if _tokenizer is None:
            from inference.loader import load_tokenizer

            _tokenizer = load_tokenizer(settings.LLM_MODEL, settings.LLM_MODEL_CACHE)
        return _tokenizer


async def aget_tokenizer():
    if _engine is not None:
        return _engine.tokenizer
    return await asyncio.to_thread(get_tokenizer)


def loaded_engine():
    """The engine if this process has loaded it, else None (never starts a load)."""
    return _engine


async def aget_engine():
    """get_engine() without blocking the event loop while the model loads."""
    if _engine is not None:
        return _engine
    return await asyncio.to_thread(get_engine)


def preload_in_background() -> None:
    """Start loading the model now, in a daemon thread; errors surface on first use."""

    def load() -> None:
        try:
            get_engine()
        except Exception:
            log.exception("Preloading the model failed; the first message will retry.")

    threading.Thread(target=load, name="engine-preload", daemon=True).start()
