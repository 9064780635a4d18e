"""Dashboard actions: resetting an engine's prefix cache, logged in the admin log."""

from __future__ import annotations

import logging

from django.contrib.admin.models import CHANGE, LogEntry
from django.utils import timezone

from chatapp.dashboard import engines
from chatapp.dashboard.models import EngineStatus
from chatapp.dashboard.sampling import prefix_cache_reset_local, snapshot_record

log = logging.getLogger(__name__)


class UnknownEngine(Exception):
    pass


def prefix_cache_reset(*, engine_id: str, user) -> str:
    """Reset an engine's prefix cache: at once when it lives in this process, otherwise
    at its next sample (its own process reads the request from the database).

    Returns "done" or "requested"; raises UnknownEngine.
    """
    local = next((s for s in engines.local_snapshots() if s.get("engine_id") == engine_id), None)
    is_local = local is not None
    if is_local:
        status = snapshot_record(snapshot=local)  # the log entry needs the row
    else:
        status = EngineStatus.objects.filter(engine_id=engine_id).first()
        if status is None:
            raise UnknownEngine(engine_id)
    EngineStatus.objects.filter(pk=status.pk).update(reset_requested_at=timezone.now())
    if is_local:
        prefix_cache_reset_local(engine=engines.local_engines()[engine_id],
                                 engine_id=engine_id)
        outcome = "done"
    else:
        log.warning("Prefix cache reset of engine %s requested by %s", engine_id, user)
        outcome = "requested"
    LogEntry.objects.log_actions(
        user_id=user.pk,
        queryset=EngineStatus.objects.filter(pk=status.pk),
        action_flag=CHANGE,
        change_message=f"Prefix cache reset {outcome}.",
        single_object=True,
    )
    return outcome
