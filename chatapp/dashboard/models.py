"""What engines report: their latest full snapshot, and a compact history of samples.

Every process that hosts an engine (the web process, Celery workers) writes rows
keyed by its engine_id, so the dashboard of any web process sees all of them.
"""

from __future__ import annotations

from django.db import models


class EngineStatus(models.Model):
    """One row per engine: its latest metrics snapshot, and reset requests addressed to it."""

    engine_id = models.CharField(max_length=100, unique=True)
    model = models.CharField(max_length=200, blank=True, default="")
    # AsyncEngine.metrics() as it was at reported_at (recent requests included).
    snapshot = models.JSONField(default=dict)
    reported_at = models.DateTimeField()
    # A reset asked for through the dashboard; the engine's own process carries it out
    # at its next sample (an engine in another process cannot be reached directly).
    reset_requested_at = models.DateTimeField(null=True, blank=True)
    reset_done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["engine_id"]
        verbose_name_plural = "engine statuses"

    def __str__(self) -> str:
        return self.engine_id

    @property
    def reset_pending(self) -> bool:
        """A reset was asked for and has not been carried out since."""
        requested, done = self.reset_requested_at, self.reset_done_at
        return requested is not None and (done is None or done < requested)


class EngineSample(models.Model):
    """An engine's counters at one moment; the charts difference consecutive samples."""

    engine_id = models.CharField(max_length=100)
    taken_at = models.DateTimeField()
    prefix_cache_queries = models.BigIntegerField(default=0)
    prefix_cache_hits = models.BigIntegerField(default=0)
    blocks_total = models.IntegerField(default=0)
    blocks_used = models.IntegerField(default=0)
    blocks_cached_free = models.IntegerField(default=0)
    blocks_free = models.IntegerField(default=0)
    evictions = models.BigIntegerField(default=0)
    preemptions = models.BigIntegerField(default=0)
    num_running = models.IntegerField(default=0)
    num_waiting = models.IntegerField(default=0)
    # The TTFT histogram's cumulative bucket counts (last = +Inf), to take interval quantiles.
    ttft_buckets = models.JSONField(default=list)
    ttft_counts = models.JSONField(default=list)

    class Meta:
        ordering = ["taken_at", "id"]
        indexes = [
            models.Index(fields=["engine_id", "taken_at"]),
            models.Index(fields=["taken_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.engine_id} @ {self.taken_at:%Y-%m-%d %H:%M:%S}"
