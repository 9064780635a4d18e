"""History samples: this process's engines' figures into the database, periodically.

`engine_sample_local()` is a plain function (the Sampler thread here calls it, a Celery
beat task could too). Nothing here may break chat: the thread catches everything, and
the engine is only read (its snapshot is taken under the engine's own lock).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from chatapp.dashboard import engines
from chatapp.dashboard.models import EngineSample, EngineStatus

log = logging.getLogger(__name__)

# The snapshot's counters a history sample keeps, under the same names.
SAMPLED = ("prefix_cache_queries", "prefix_cache_hits", "blocks_total", "blocks_used",
           "blocks_cached_free", "blocks_free", "evictions", "preemptions", "num_running",
           "num_waiting")


def snapshot_record(*, snapshot: dict, now=None) -> EngineStatus:
    """Store an engine's snapshot: replace its status row, add one history sample."""
    now = now or timezone.now()
    engine_id = str(snapshot.get("engine_id") or "unknown")
    ttft = snapshot.get("ttft_seconds") or {}
    with transaction.atomic():
        status, _ = EngineStatus.objects.update_or_create(
            engine_id=engine_id,
            defaults={"model": str(snapshot.get("model") or ""), "snapshot": snapshot,
                      "reported_at": now},
        )
        EngineSample.objects.create(
            engine_id=engine_id,
            taken_at=now,
            **{name: snapshot.get(name, 0) for name in SAMPLED},
            ttft_buckets=list(ttft.get("buckets") or []),
            ttft_counts=list(ttft.get("cumulative_counts") or []),
        )
    return status


def samples_prune(*, now=None) -> int:
    """Delete samples older than DASHBOARD_RETENTION_HOURS; returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(hours=settings.DASHBOARD_RETENTION_HOURS)
    deleted, _ = EngineSample.objects.filter(taken_at__lt=cutoff).delete()
    return deleted


def prefix_cache_reset_local(*, engine, engine_id: str) -> None:
    """Reset this process's engine now: cached-free blocks lose their hashes (blocks in
    use by running requests are untouched, as in vLLM)."""
    engine.reset_prefix_cache()
    EngineStatus.objects.filter(engine_id=engine_id).update(reset_done_at=timezone.now())
    log.warning("Prefix cache of engine %s reset", engine_id)


def _apply_requested_reset(engine, engine_id: str) -> None:
    """Carry out a reset the dashboard of some web process asked of this engine."""
    status = EngineStatus.objects.filter(engine_id=engine_id).first()
    if status is not None and status.reset_pending:
        prefix_cache_reset_local(engine=engine, engine_id=engine_id)


def engine_sample_local() -> bool:
    """Sample each engine of this process (one per loaded model); True when a sample was
    written."""
    loaded = engines.loaded_engines()
    for alias, engine in loaded.items():
        snapshot = engines.engine_snapshot(engine, alias)
        _apply_requested_reset(engine, str(snapshot.get("engine_id") or ""))
        snapshot_record(snapshot=snapshot)
    if not loaded:
        return False
    samples_prune()
    return True


class Sampler(threading.Thread):
    """Calls engine_sample_local() every `interval` seconds for the life of the process."""

    def __init__(self, interval: float):
        super().__init__(name="dashboard-sampler", daemon=True)
        self.interval = interval

    def run(self) -> None:
        while True:
            time.sleep(self.interval)
            self.run_once()

    def run_once(self) -> bool:
        try:
            return engine_sample_local()
        except Exception:
            # The database may be busy or gone; the next tick tries again, chat goes on.
            log.warning("Dashboard sample failed", exc_info=True)
            return False
        finally:
            close_old_connections()


_sampler: Sampler | None = None
_sampler_lock = threading.Lock()


def start_sampler() -> Sampler | None:
    """Start this process's sampler once (DASHBOARD_SAMPLE_INTERVAL_S > 0)."""
    global _sampler
    interval = float(getattr(settings, "DASHBOARD_SAMPLE_INTERVAL_S", 0) or 0)
    if interval <= 0:
        return None
    with _sampler_lock:
        if _sampler is None or not _sampler.is_alive():
            _sampler = Sampler(interval)
            _sampler.start()
    return _sampler
