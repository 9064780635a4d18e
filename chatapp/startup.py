"""What every serving process starts with, daphne and each Celery worker's pool child
alike: the engine loading in the background (a worker always loads it) and the
dashboard's sampler. asgi.py calls start_process; a worker imports this module through
CELERY_IMPORTS, and its pool children start here as they fork."""

from __future__ import annotations

from celery.signals import worker_process_init

from chatapp.dashboard.sampling import start_sampler
from chatapp.generation import served_models
from chatapp.generation.embedded import preload_in_background
from chatapp.generation.orphans import start_sweeper


def start_process(*, preload: bool) -> None:
    served_models.check()  # a mistake in LLM_MODELS stops the start, with its message
    if preload:
        preload_in_background()
    # History samples for the cache dashboard (a no-op until the engine is loaded; never
    # raises into chat). DASHBOARD_SAMPLE_INTERVAL_S=0 turns it off.
    start_sampler()
    # Replies a dead process left streaming (this one's predecessor first) are finished
    # as interrupted, with their text.
    start_sweeper()


@worker_process_init.connect
def _start_worker_child(**kwargs) -> None:
    # The child must report ready within seconds: the engine loads in the background.
    start_process(preload=True)
