"""Replies whose process died: found and finished as interrupted, keeping their text.

Every process that generates replies names itself "host:pid:token" (`this_runner`) and
writes that name on the replies it runs. A reply is an orphan when its process is known
dead (same host, pid gone or reused by a new process) or when it went untouched for
CHAT_ORPHAN_S while its generation persists it every CHAT_HEARTBEAT_S (any host). Each
serving process sweeps at start-up (its predecessor's replies come back at once) and
then every few seconds; a send, a page's socket and a worker's claim sweep too. A read
(a GET) writes nothing: it shows an orphan as interrupted (`as_read`) and leaves the
row to the next sweep.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import close_old_connections

from chatapp.chat import services as chat_services
from chatapp.chat.models import Conversation, Message
from chatapp.chat.payloads import message_dict
from chatapp.generation.events import publish

log = logging.getLogger(__name__)

_runner: tuple[int, str] | None = None  # (pid, name): a forked child names itself anew
_sweeper: threading.Thread | None = None


def this_runner() -> str:
    """This process's name on the replies it generates."""
    global _runner
    if _runner is None or _runner[0] != os.getpid():
        _runner = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}")
    return _runner[1]


def runner_is_dead(runner: str) -> bool:
    """True when `runner` was a process on this host that is gone: its pid no longer
    exists, or is this process (a restart in a container often gets the same pid).
    False when it cannot tell (another host, a live pid): the heartbeat rule decides."""
    host, _, rest = runner.partition(":")
    pid_text, _, _token = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit() or runner == this_runner():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def orphans(*, conversation: Conversation | None = None):
    """The active replies no live process is behind (a queryset)."""
    active = Message.objects.filter(status__in=Message.ACTIVE).exclude(runner="")
    if conversation is not None:
        active = active.filter(conversation=conversation)
    dead = [pk for pk, runner in active.values_list("pk", "runner") if runner_is_dead(runner)]
    stale = chat_services.stale_replies(conversation=conversation)
    return Message.objects.filter(pk__in=dead) | stale


def recover(*, conversation: Conversation | None = None) -> list[int]:
    """Finish the orphans as interrupted and tell their conversations' pages; their ids."""
    ids = interrupt(orphans(conversation=conversation))
    if ids:
        log.warning("Reply(s) %s lost their process; finished as interrupted", ids)
    return ids


def interrupt(replies) -> list[int]:
    """Finish the active replies of `replies` (a queryset) as interrupted, and send each
    page its message.done: the reply's one, since no generation can write the row after
    this (lifecycle.reply_finish_held refuses an interrupted reply). Their ids."""
    ids = chat_services.replies_interrupt(replies=replies)
    announce(ids)
    return ids


def announce(ids: list[int]) -> None:
    """Send the pages of replies `ids`, just finished as interrupted, their message.done."""
    for reply in Message.objects.select_related("conversation").filter(pk__in=ids):
        try:
            async_to_sync(publish)(reply.conversation.group_name, {
                "type": "message.done", "message_id": reply.pk, "seq": 0,
                "message": message_dict(reply)})
        except Exception:  # the page finds it on its next load
            log.warning("Announcing interrupted reply %s failed", reply.pk, exc_info=True)


def as_read(messages: list[Message], *, conversation: Conversation) -> list[Message]:
    """`messages` as a reader should see them: an orphan among them reads interrupted
    already, though only a sweep or a write finishes it in the database."""
    lost = set(orphans(conversation=conversation).values_list("pk", flat=True))
    for m in messages:
        if m.pk in lost and m.status in Message.ACTIVE:
            m.status, m.finish_reason = Message.Status.INTERRUPTED, "interrupted"
    return messages


def _sweep_forever(period_s: float) -> None:
    stop = threading.Event()
    while True:
        try:
            recover()
        except Exception:  # a database still migrating, or down for a moment
            log.debug("Orphan sweep failed", exc_info=True)
        finally:
            close_old_connections()
        stop.wait(period_s)


def start_sweeper() -> None:
    """Sweep now (in the background) and every CHAT_ORPHAN_SWEEP_S, once per process."""
    global _sweeper
    if settings.CHAT_ORPHAN_SWEEP_S <= 0 or (_sweeper is not None and _sweeper.is_alive()):
        return
    _sweeper = threading.Thread(target=_sweep_forever, args=(settings.CHAT_ORPHAN_SWEEP_S,),
                                name="orphan-sweeper", daemon=True)
    _sweeper.start()
