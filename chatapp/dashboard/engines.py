"""This process's engine, seen from the dashboard without ever loading it: opening a
page must not start a model load (seconds, gigabytes)."""

from __future__ import annotations

from typing import Any

from chatapp.generation.embedded import loaded_engine as local_engine


def engine_identity(engine: Any) -> dict[str, str]:
    """The engine's kernel path, activation dtype and weight dtype (stats.IDENTITY); a key
    the engine does not expose (a stand-in in tests, an older engine) is left out."""
    # AsyncEngine wraps the LLMEngine that holds cpu_path; both share one config.
    inner = getattr(engine, "engine", None)
    config = getattr(engine, "config", None)
    found = {
        "cpu_path": getattr(engine, "cpu_path", None) or getattr(inner, "cpu_path", None),
        "dtype": getattr(config, "dtype", None),
        "weight_dtype": getattr(config, "weight_dtype", None),
    }
    return {key: str(value) for key, value in found.items() if value is not None}


def engine_snapshot(engine: Any) -> dict:
    """engine.metrics() plus its identity, so engines in other processes (whose snapshots
    travel through the database) report their kernel path too."""
    return {**engine_identity(engine), **engine.metrics()}


def local_snapshot() -> dict | None:
    """engine_snapshot() of this process's engine, or None when none is loaded."""
    engine = local_engine()
    return None if engine is None else engine_snapshot(engine)
