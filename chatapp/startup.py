"""What every serving process starts with, the web's daphne and each Celery worker
alike: the engine loading in the background (when asked) and the dashboard's sampler."""

from __future__ import annotations

from chatapp.dashboard.sampling import start_sampler
from chatapp.generation.engine import preload_in_background


def start_process(*, preload: bool) -> None:
    if preload:
        preload_in_background()
    # History samples for the cache dashboard (a no-op until the engine is loaded; never
    # raises into chat). DASHBOARD_SAMPLE_INTERVAL_S=0 turns it off.
    start_sampler()
