"""Generations the service asks for itself after a reply (history summaries, titles):
background work that never goes in front of a user's request. The caller says whether
a Celery worker takes it (chatapp.generation.dispatch.enqueue_background); otherwise it
runs on this process's engine once that has nothing running or waiting (or after
IDLE_WAIT_S, so a server that is never idle still gets them)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from chatapp.generation.embedded import aget_engine
from chatapp.generation.jobs import Generation, Job, run_here

IDLE_WAIT_S = 30.0
IDLE_POLL_S = 0.1

_tasks: set[asyncio.Task] = set()  # background generations here (the loop keeps weak refs)


async def when_idle(model: str) -> None:
    """Until `model`'s engine here has nothing running or waiting, or IDLE_WAIT_S passed."""
    engine = await aget_engine(model)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + IDLE_WAIT_S
    while loop.time() < deadline:
        figures = engine.metrics()
        if not figures.get("num_running") and not figures.get("num_waiting"):
            return
        await asyncio.sleep(IDLE_POLL_S)


async def run_when_idle(generate: Callable[[], Awaitable[object]], *, model: str,
                        detached: bool) -> None:
    """`generate()` once `model`'s engine is idle: in a task of its own (`detached`: the
    web process, whose reply has returned) or before returning (a worker's task, whose
    event loop ends with it)."""
    async def later() -> None:
        await when_idle(model)
        await generate()

    if not detached:
        await later()
        return
    task = asyncio.create_task(later())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def settled() -> None:
    """Until this process runs no background generation (shutdown; tests)."""
    while _tasks:
        await asyncio.gather(*list(_tasks), return_exceptions=True)


async def generate_here(job: Job) -> Generation:
    """Run `job` to its end on this process's engine; its choice and usage are on it."""
    generation = Generation(job, run_here)
    async for _ in generation.outputs():
        pass
    return generation
