"""This process's engine, seen from the dashboard without ever loading it: opening a
page must not start a model load (seconds, gigabytes)."""

from __future__ import annotations

from chatapp.generation.engine import loaded_engine as local_engine


def local_snapshot() -> dict | None:
    """AsyncEngine.metrics() of this process's engine, or None when none is loaded."""
    engine = local_engine()
    return None if engine is None else engine.metrics()
