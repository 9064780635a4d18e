"""This process's engine, seen from the dashboard without ever loading it.

The dashboard must not start a model load (seconds, gigabytes) because someone
opened a page: it only looks at the engine the chat service already loaded.
"""

from __future__ import annotations


def local_engine():
    """The engine loaded in this process, or None."""
    from chatapp.generation import engine as host

    return host._engine


def local_snapshot() -> dict | None:
    """AsyncEngine.metrics() of this process's engine, or None when none is loaded."""
    engine = local_engine()
    if engine is None:
        return None
    return engine.metrics()
