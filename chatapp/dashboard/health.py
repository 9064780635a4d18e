"""Liveness and readiness checks for /healthz and /readyz.

Ready means this process can answer a chat message now: its models are loaded, the
database answers, and Redis (the channel layer, when REDIS_URL is set) answers.
Each check is bounded and never raises.
"""

from __future__ import annotations

import contextlib

from django.conf import settings
from django.db import connections

from chatapp.dashboard import engines
from chatapp.generation import model_cards, served_models

CHECK_TIMEOUT_S = 2


def _failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:300]


def check_model() -> tuple[bool, str]:
    """Every served model loaded (with several, the detail names those still loading)."""
    loaded = engines.loaded_engines()
    missing = [alias for alias in served_models.aliases() if alias not in loaded]
    if not missing:
        return True, "loaded"
    if len(missing) == len(served_models.aliases()):
        return False, "not loaded"
    return False, "not loaded: " + ", ".join(missing)


def models() -> list[dict]:
    """Each served model as /v1/models describes it, and whether this process loaded it."""
    out = []
    for alias in served_models.aliases():
        try:
            out.append({"alias": alias, **model_cards.card(alias)})
        except Exception as exc:  # a probe never fails on a description
            out.append({"alias": alias, "error": _failure(exc)})
    return out


def check_database(alias: str = "default") -> tuple[bool, str]:
    conn = connections[alias]
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return True, "ok"
    except Exception as exc:
        # A broken connection is dropped, so the next request connects afresh.
        with contextlib.suppress(Exception):
            conn.close()
        return False, _failure(exc)


def check_redis(url: str) -> tuple[bool, str]:
    try:
        import redis

        with redis.Redis.from_url(url, socket_connect_timeout=CHECK_TIMEOUT_S,
                                  socket_timeout=CHECK_TIMEOUT_S) as client:
            client.ping()
        return True, "ok"
    except Exception as exc:
        return False, _failure(exc)


def readiness() -> tuple[bool, dict[str, dict]]:
    """(ready, {check: {"ok": bool, "detail": str}}); a loaded model's check also says
    which kernel path and dtypes it runs with (cpu_path, dtype, weight_dtype, kv_dtype)."""
    checks = {"model": check_model(), "database": check_database()}
    redis_url = getattr(settings, "REDIS_URL", "")
    if redis_url:
        checks["redis"] = check_redis(redis_url)
    report = {name: {"ok": ok, "detail": detail} for name, (ok, detail) in checks.items()}
    engine = engines.local_engine()
    if engine is not None:
        report["model"].update(engines.engine_identity(engine))
    return all(ok for ok, _ in checks.values()), report
