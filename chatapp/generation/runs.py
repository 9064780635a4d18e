"""A reply being generated in this process: one `ReplyRun` per reply, its state named,
its transitions methods.

    queued ──take──▶ running ──begin_finish──▶ finishing ──finished──▶ done | stopped | failed
       │                │                          │
       └────────────────┴──supersede / refused─────┴──────────────────▶ interrupted

`interrupted` means the reply's record is not this run's to write: another generation
took it over, a sweep finished it as interrupted (its process looked dead), or it was
deleted. Whoever wrote that record announced it; this run goes quiet.

Each event reaches the conversation's group from one transition only: `started` gives
message.started, `output`/`flush` the numbered deltas (only while running), and
`finished` the one message.done, after the final write the row lock let through.
Between processes the database row lock is the arbiter (lifecycle.reply_finish_held);
inside one, the run's state is. A transition that waits on the database is split at
that wait (`persist` / `beaten`, `write_final` / `finished`), so a test can interleave
them as the event loop may.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from chatapp.chat.models import Message
from chatapp.chat.payloads import message_dict
from chatapp.generation import lifecycle, receipts
from chatapp.generation.events import DeltaBatcher

log = logging.getLogger(__name__)


class RunState(enum.StrEnum):
    QUEUED = "queued"  # registered, waiting for its model; not yet named as ours
    RUNNING = "running"  # ours: building its prompt, then generating
    FINISHING = "finishing"  # its final record is being written
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # the record is another's (see the module docstring)


FINAL_STATES = frozenset({RunState.DONE, RunState.STOPPED, RunState.FAILED,
                          RunState.INTERRUPTED})
_ENDED_AS = {Message.Status.DONE: RunState.DONE, Message.Status.STOPPED: RunState.STOPPED,
             Message.Status.ERROR: RunState.FAILED}


class ReplyRun:
    """One reply's generation in this process. `lease`: a worker's claim (the run is
    taken already); `runner`: this process's name on the row (orphans.this_runner)."""

    def __init__(self, reply_id: int, *, runner: str, lease: str = "",
                 batch_tokens: int = 4, flush_s: float = 0.1):
        self.reply_id = reply_id
        self.runner = runner
        self.lease = lease
        self.request_id = Message.request_id_for(reply_id)
        self.state = RunState.QUEUED
        self.stop_asked = False
        self.engine = None  # the engine generating it, once known (to abort)
        self.task = None  # the asyncio task running it here, if any
        self.over = asyncio.Event()  # set once it has left this process's runs
        self.group = ""
        self.builder = None
        self.prepared = None  # replies.Prepared
        self.last = None  # the engine's latest output
        self._beat_out = None  # the output the last heartbeat stored
        self.batcher = DeltaBatcher(batch_tokens, flush_s)
        self.base_text = ""  # what message.started said the reply holds
        self.streamed = ""  # the text of the deltas given out so far

    def __repr__(self) -> str:
        return f"<ReplyRun {self.reply_id} {self.state}>"

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def seq(self) -> int:
        """The sequence number of the last delta given out."""
        return self.batcher.seq

    # -- start -------------------------------------------------------------------

    def take(self) -> bool:
        """queued → running once the row names this process (a worker's run holds its
        lease already); else → interrupted: the reply ended before (stopped, deleted,
        swept), and whoever ended it said so. Blocking (the database)."""
        if self.state != RunState.QUEUED:
            return False
        if self.lease or lifecycle.reply_take(reply_id=self.reply_id):
            self.state = RunState.RUNNING
            return True
        self.state = RunState.INTERRUPTED
        return False

    def started(self, *, group: str, builder, prepared) -> dict | None:
        """The prompt is built: the message.started event (None once no longer running)."""
        self.group, self.builder, self.prepared = group, builder, prepared
        self.base_text = prepared.kept_text
        if self.state != RunState.RUNNING:
            return None
        return {"type": "message.started", "message_id": self.reply_id,
                "prompt_tokens": len(prepared.prompt_ids), "text": prepared.kept_text}

    # -- generate ----------------------------------------------------------------

    def output(self, out) -> list[dict]:
        """Record the engine's output `out`; the delta due, if any (only while running)."""
        self.last = out
        if self.stop_asked and not out.finished:
            # The stop came before the engine knew this request id (its prompt was still
            # being built); the abort reaches it now, and the stream ends with "abort".
            self._abort()
        self.batcher.add(out.text_delta, len(out.new_token_ids))
        if self.state == RunState.RUNNING and self.batcher.due() and not out.finished:
            return [self._delta()]
        return []

    def flush(self) -> list[dict]:
        """The last delta, once the stream has ended (while running)."""
        if self.state == RunState.RUNNING and self.batcher.text:
            return [self._delta()]
        return []

    def _delta(self) -> dict:
        seq, text = self.batcher.take()
        self.streamed += text
        return {"type": "message.delta", "message_id": self.reply_id, "seq": seq, "text": text}

    def snapshot(self) -> dict | None:
        """For a page that (re)opens mid-reply: the text given out up to delta `seq`, so it
        resumes at seq + 1 with no gap and no repeat; None unless running."""
        if self.state != RunState.RUNNING or self.group == "":
            return None
        return {"type": "message.resumed", "message_id": self.reply_id, "seq": self.seq,
                "text": self.base_text + self.streamed}

    # -- stop, supersede ---------------------------------------------------------

    def stop(self) -> bool:
        """Stop asked for (only Stop stops a reply): the engine request is aborted and the
        reply ends stopped with its text. False when it is finishing or ended already."""
        if self.state not in (RunState.QUEUED, RunState.RUNNING):
            return False
        self.stop_asked = True
        self._abort()
        return True

    def supersede(self) -> None:
        """The row is no longer this run's (taken over, swept as interrupted, deleted):
        abort, and say nothing more about the reply. Not once finishing: then the final
        write's row lock decides."""
        if self.state not in (RunState.QUEUED, RunState.RUNNING):
            return
        log.warning("Reply %s is no longer this generation's; aborting it", self.reply_id)
        self.state = RunState.INTERRUPTED
        self._abort()

    def _abort(self) -> None:
        if self.engine is not None:
            self.engine.abort(self.request_id)

    # -- heartbeat ---------------------------------------------------------------

    def progress(self) -> dict | None:
        """The columns the next heartbeat stores: the text, ids and usage so far (None
        before the first token, or when the last beat stored them already)."""
        out = self.last
        if out is None or out is self._beat_out or self.prepared is None:
            return None
        self._beat_out = out
        prepared = self.prepared
        generated = prepared.kept_ids + list(out.token_ids)
        return {
            "content": prepared.kept_text + out.text,
            "generated_token_ids": generated,
            # The segment of a reply cut here: what the next turn's prompt holds after a crash.
            "token_ids": self.builder.assistant_segment(generated, False),
            "completion_tokens": len(generated),
            **_usage(out),
        }

    def persist(self, progress: dict | None) -> bool:
        """One heartbeat's write: touch the row and store `progress`; False when the row is
        no longer this run's (or no longer active). Blocking (the database)."""
        return lifecycle.reply_persist(reply_id=self.reply_id, runner=self.runner,
                                       lease=self.lease, progress=progress)

    def beaten(self, ours: bool) -> bool:
        """What a heartbeat's write found; True to keep beating. Refused while running:
        superseded. Refused while finishing: this run's own final write got there first
        (no takeover; its message.done is still to come)."""
        if ours and not self.ended:
            return True
        if not ours and self.state in (RunState.QUEUED, RunState.RUNNING):
            self.supersede()
        return False

    # -- finish ------------------------------------------------------------------

    def begin_finish(self) -> bool:
        """running → finishing, before the final write is sent; False (nothing to write)
        when the run is no longer running."""
        if self.state != RunState.RUNNING:
            return False
        self.state = RunState.FINISHING
        return True

    def final_fields(self, *, error: str = "") -> dict:
        """The final record's columns from the last output (done, stopped or error)."""
        last, prepared = self.last, self.prepared
        generated = prepared.kept_ids + (list(last.token_ids) if last is not None else [])
        reason = last.finish_reason if last is not None and last.finished else None
        if error or reason == "error":
            status, reason = Message.Status.ERROR, "error"
            error = error or (last.error if last is not None else "") or "Generation failed."
        elif reason in ("stop", "length"):  # a stop that came after the end changes nothing
            status = Message.Status.DONE
        else:  # aborted, cancelled, or the stream ended early
            status, reason = Message.Status.STOPPED, "abort"
        fields = {
            "status": status,
            "content": prepared.kept_text + (last.text if last is not None else ""),
            "generated_token_ids": generated,
            "finish_reason": reason,
            "error": error,
        }
        if status != Message.Status.ERROR:
            fields["segment_token_ids"] = self.builder.assistant_segment(generated,
                                                                         reason == "stop")
        if last is not None:
            fields.update(_usage(last))
        fields["prefix_cache"] = receipts.receipt(
            getattr(last, "prefix_cache", None), prepared.diverged, self.builder.block_size,
            prepared.plan)
        return fields

    def write_final(self, fields: dict) -> Message | None:
        """The final write, under the row lock: None when the row is another's now (taken
        over, or finished as interrupted). Blocking (the database); Message.DoesNotExist
        when the reply was deleted."""
        return lifecycle.reply_finish_held(reply_id=self.reply_id, lease=self.lease,
                                           runner=self.runner, **fields)

    def finished(self, record: Message | None) -> dict | None:
        """finishing → done | stopped | failed, with the reply's one message.done; or →
        interrupted (None) when the write was refused: that record stands, and was
        announced by whoever wrote it."""
        if self.state != RunState.FINISHING:
            return None
        if record is None:
            self.state = RunState.INTERRUPTED
            return None
        self.state = _ENDED_AS.get(record.status, RunState.FAILED)
        return {"type": "message.done", "message_id": self.reply_id, "seq": self.seq + 1,
                "message": message_dict(record)}

    def gone(self) -> None:
        """The reply was deleted (with its conversation): nothing is left to record."""
        if not self.ended:
            self.state = RunState.INTERRUPTED
            self._abort()


def _usage(out) -> dict:
    return {"prompt_tokens": out.prompt_tokens, "cached_tokens": out.cached_tokens,
            "ttft": out.ttft}


class Runs:
    """This process's replies in generation: reply id → its ReplyRun. A run is in the
    map from its start until it has ended (its task holds it there: the event loop keeps
    only weak references to tasks, and a reply must outlive the socket that asked)."""

    def __init__(self):
        self._runs: dict[int, ReplyRun] = {}

    def add(self, run: ReplyRun) -> ReplyRun:
        """Register `run`; the live run of that reply instead, if there is one."""
        current = self._runs.get(run.reply_id)
        if current is not None and not current.ended:
            return current
        self._runs[run.reply_id] = run
        return run

    def get(self, reply_id: int) -> ReplyRun | None:
        return self._runs.get(reply_id)

    def remove(self, run: ReplyRun) -> None:
        if self._runs.get(run.reply_id) is run:
            del self._runs[run.reply_id]

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self):
        return iter(list(self._runs.values()))


RUNS = Runs()
