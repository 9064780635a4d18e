"""A /v1 reply's usage, recorded once when it ends (chatapp.accounting.services)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async

from chatapp.accounting.services import ReplyUsage, reply_record

log = logging.getLogger(__name__)

# How an error reaches a client once a stream has begun (chat and text completions'
# error object; the Responses API's failure events).
ERROR_EVENTS = (b'data: {"error"', b"event: error", b"event: response.failed")


def _usage_of(run: Any) -> ReplyUsage:
    """The run's usage so far (a run that failed early may have none)."""
    if run is None:
        return ReplyUsage()
    try:
        return ReplyUsage.from_body(run.usage())
    except Exception:
        return ReplyUsage()


async def record_usage(*, run: Any, key, model: str, error: bool) -> None:
    usage = _usage_of(run)
    try:
        await sync_to_async(lambda: reply_record(user=key.user, key=key, model=model,
                                                 usage=usage, error=error))()
    except Exception:
        log.exception("Usage of a /v1 reply not recorded")


async def accounted(events: AsyncIterator[bytes], *, run: Any, key,
                    model: str) -> AsyncIterator[bytes]:
    """The stream's events as they are; its usage recorded when it ends, however it ends."""
    error = False
    try:
        async for event in events:
            error = error or event.startswith(ERROR_EVENTS)
            yield event
    except Exception:  # (a client that leaves is no error)
        error = True
        raise
    finally:
        if hasattr(events, "aclose"):
            await events.aclose()
        await record_usage(run=run, key=key, model=model, error=error)
