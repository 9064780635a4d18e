"""This process's engines (one per served model), seen from the dashboard without ever
loading one: opening a page must not start a model load (seconds, gigabytes)."""

from __future__ import annotations

from typing import Any

from chatapp.generation.embedded import loaded_engine as local_engine  # noqa: F401 (the default's)
from chatapp.generation.embedded import loaded_engines


def engine_identity(engine: Any) -> dict[str, str]:
    """The engine's kernel path, activation, weight and KV cache dtypes (stats.IDENTITY); a key
    the engine does not expose (a stand-in in tests, an older engine) is left out."""
    # AsyncEngine wraps the LLMEngine that holds cpu_path; both share one config.
    inner = getattr(engine, "engine", None)
    config = getattr(engine, "config", None)
    found = {
        "cpu_path": getattr(engine, "cpu_path", None) or getattr(inner, "cpu_path", None),
        "dtype": getattr(config, "dtype", None),
        "weight_dtype": getattr(config, "weight_dtype", None),
        "kv_dtype": getattr(config, "kv_dtype", None),
    }
    return {key: str(value) for key, value in found.items() if value is not None}


def engine_snapshot(engine: Any, model: str = "") -> dict:
    """engine.metrics() plus its identity, so engines in other processes (whose snapshots
    travel through the database) report their kernel path too. `model` (the alias it
    serves) becomes the snapshot's `model`, the name the dashboard and /metrics label it
    with; the engine's own name for what it loaded stays as `model_path`."""
    snapshot = {**engine_identity(engine), **engine.metrics()}
    if model:
        snapshot["model_path"] = snapshot.get("model", "")
        snapshot["model"] = model
    return snapshot


def local_engines() -> dict[str, Any]:
    """engine id -> engine, for every model this process has loaded."""
    return {engine.config.engine_id: engine for engine in loaded_engines().values()}


def local_snapshots() -> list[dict]:
    """engine_snapshot() of each engine this process has loaded (none loaded: empty)."""
    return [engine_snapshot(engine, alias) for alias, engine in loaded_engines().items()]
