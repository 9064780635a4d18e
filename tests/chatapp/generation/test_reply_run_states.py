"""A reply's run against every order of its events: Hypothesis drives one ReplyRun (the
real class, the real database rows, the real channel layer) through its generation
steps, its heartbeat (each split at its database wait, as the event loop splits it),
Stop, a sweep that finishes the reply as interrupted (its process looked dead) and the
death of its process, in any order. Whatever the order, the reply ends in one final
state, and its page gets exactly one message.done; its deltas are numbered without a
gap or a repeat. The one exception is a process that dies between its final write and
sending its done: nobody can tell that from a done sent, so none comes, and the page,
whose socket died with that process, reads the final row when it reconnects.

The engine is the one part not run here: each example decides its outputs, under the
contract the run relies on (AsyncEngine.abort: after an abort, the request's stream ends
with a final "abort" output, maybe after outputs already on their way).
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from chatapp.chat import services
from chatapp.chat.models import Message
from chatapp.generation import lifecycle, orphans
from chatapp.generation.embedded import get_tokenizer
from chatapp.generation.events import publish
from chatapp.generation.replies import Prepared
from chatapp.generation.runs import FINAL_STATES, ReplyRun, RunState
from chatapp.prompts.services import builder_for
from inference.outputs import RequestOutput

# Not marked `model`: it loads the tokenizer only (and .ci/run runs it on SQLite too).
pytestmark = pytest.mark.django_db

TEXT = "One, two, three, four, five, six, seven, eight, nine, ten."
PROMPT_TOKENS = 40


class EngineContract:
    """What the run may ask of the engine: abort, by request id."""

    def __init__(self):
        self.aborted: set[str] = set()

    def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)


class ReplyRunMachine(RuleBasedStateMachine):
    """One reply per example. `pc` is where the run's generation coroutine stands (each
    rule is what happens between two of its awaits); `beat` is its heartbeat's."""

    owner = None  # set by the test
    tokenizer = None
    counter = itertools.count()

    def __init__(self):
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.engine = EngineContract()
        self.ids = self.tokenizer.encode(TEXT, add_special_tokens=False)
        self.n_out = 0
        self.engine_ended = False
        self.record = None
        self.stop_before_end = False  # a stop reached the run before the engine ended
        self.told_not_ours = False  # a heartbeat found the row another's while running
        self.died_at = ""
        self.deltas_after_told = 0

    # -- set-up ------------------------------------------------------------------

    @initialize()
    def new_reply(self):
        conv = services.conversation_create(owner=self.owner)
        _, self.reply = services.message_send(conversation=conv, content="Count to ten.")
        self.group = conv.group_name
        self.layer = self.channel_layer()
        self.channel = self.run_async(self.layer.new_channel())
        self.run_async(self.layer.group_add(self.group, self.channel))
        self.run = ReplyRun(self.reply.pk, runner=orphans.this_runner(), batch_tokens=2,
                            flush_s=float("inf"))
        self.pc = "queued"
        self.beat = "off"
        self.heard: list[dict] = []

    @staticmethod
    def channel_layer():
        from channels.layers import get_channel_layer

        return get_channel_layer()

    def run_async(self, coro):
        return self.loop.run_until_complete(coro)

    def send(self, events) -> None:
        for event in events:
            if self.told_not_ours and event["type"] == "message.delta":
                self.deltas_after_told += 1
            self.run_async(publish(self.run.group or self.group, event))

    @property
    def alive(self) -> bool:
        return self.pc not in ("ended", "dead")

    # -- the generation coroutine ---------------------------------------------------

    @precondition(lambda self: self.pc == "queued")
    @rule()
    def take(self):
        if self.run.take():
            self.pc, self.beat = "prepare", "sleeping"
        else:
            self.pc = "ended"

    @precondition(lambda self: self.pc == "prepare")
    @rule()
    def prompt_built(self):
        reply = Message.objects.select_related("conversation").get(pk=self.reply.pk)
        builder = builder_for(self.tokenizer)
        marked = lifecycle.reply_mark_streaming(
            reply=reply, served_by="test", segment_token_ids=builder.assistant_segment([], False))
        prepared = Prepared(reply, None, None, list(range(PROMPT_TOKENS)), [], "", marked)
        # As replies._generate from here on.
        self.run.engine = self.engine
        if not prepared.marked:
            self.run.supersede()
        started = self.run.started(group=self.group, builder=builder, prepared=prepared)
        self.send([started] if started else [])
        self.pc = "flush" if self.run.stop_asked or self.run.ended else "generating"

    @precondition(lambda self: self.pc == "generating")
    @rule(finish=st.sampled_from([None, None, None, "stop", "length"]))
    def engine_step(self, finish):
        aborted = self.run.request_id in self.engine.aborted
        self.n_out = min(self.n_out + 1, len(self.ids))
        if self.n_out == len(self.ids) and finish is None:
            finish = "length"
        # An abort ends the stream at a step of the engine's: outputs already on their way
        # (a draw of None) still come first.
        reason = "abort" if aborted and finish is not None else finish
        out = self.output(self.n_out if reason != "abort" else self.last_n, reason)
        self.send(self.run.output(out))
        if out.finished:
            self.engine_ended = True
            self.pc = "flush"

    def output(self, n: int, reason: str | None) -> RequestOutput:
        text = self.tokenizer.decode(self.ids[:n])
        before = self.tokenizer.decode(self.ids[: self.last_n]) if self.last_n else ""
        new = self.ids[self.last_n:n]
        self.last_n = n
        return RequestOutput(
            request_id=self.run.request_id, index=0, text_delta=text[len(before):],
            new_token_ids=list(new), token_ids=list(self.ids[:n]), text=text,
            finished=reason is not None, finish_reason=reason, prompt_tokens=PROMPT_TOKENS,
            cached_tokens=0, ttft=0.01)

    last_n = 0

    @precondition(lambda self: self.pc == "flush")
    @rule()
    def flush_and_begin_finish(self):
        self.send(self.run.flush())
        self.fields = self.run.final_fields()
        self.pc = "writing" if self.run.begin_finish() else "ended"
        if self.pc == "ended":
            self.beat = "off"

    @precondition(lambda self: self.pc == "writing")
    @rule()
    def final_write(self):
        self.record = self.run.write_final(self.fields)
        self.pc = "announcing"

    @precondition(lambda self: self.pc == "announcing")
    @rule()
    def publish_done(self):
        done = self.run.finished(self.record)
        self.send([done] if done else [])
        self.pc, self.beat = "ended", "off"  # its watchers are cancelled as it returns

    # -- the heartbeat coroutine ----------------------------------------------------

    @precondition(lambda self: self.alive and self.beat == "sleeping")
    @rule()
    def heartbeat_write(self):
        self.ours = self.run.persist(self.run.progress())
        self.beat = "answered"

    @precondition(lambda self: self.alive and self.beat == "answered")
    @rule()
    def heartbeat_answer(self):
        if not self.ours and self.run.state == RunState.RUNNING:
            self.told_not_ours = True
        self.beat = "sleeping" if self.run.beaten(self.ours) else "off"

    # -- the outside world ------------------------------------------------------------

    # Rarer than the run's own steps (a draw of 0 acts), so that examples reach the
    # finishing steps as often as the early ends.

    @precondition(lambda self: self.alive)
    @rule(draw=st.integers(0, 2))
    def stop(self, draw):
        if draw:
            return
        if self.pc in ("queued", "prepare", "generating") and not self.engine_ended:
            self.stop_before_end = True
        self.run.stop()

    @rule(draw=st.integers(0, 2))
    def sweep(self, draw=0):
        """Another process finishes the reply as interrupted (its runner looked dead, or
        its heartbeat late), and announces it."""
        if draw:
            return
        orphans.interrupt(Message.objects.filter(pk=self.reply.pk))

    @precondition(lambda self: self.alive)
    @rule(draw=st.integers(0, 4))
    def process_dies(self, draw):
        if draw:
            return
        self.died_at = self.pc
        self.pc, self.beat = "dead", "off"

    # -- the states, after every step ------------------------------------------------

    @invariant()
    def the_state_names_where_the_run_is(self):
        if not hasattr(self, "run") or self.pc == "dead":
            return
        state = self.run.state
        if self.told_not_ours:  # a refused heartbeat while running: no longer ours
            assert state == RunState.INTERRUPTED, state
        expected = {"queued": {RunState.QUEUED},
                    "writing": {RunState.FINISHING}, "announcing": {RunState.FINISHING},
                    "ended": FINAL_STATES}.get(self.pc)
        if expected is not None:
            assert state in expected, (self.pc, state)
        elif state != RunState.INTERRUPTED:  # prepare, generating, flush
            assert state == RunState.RUNNING, (self.pc, state)

    # -- the end ------------------------------------------------------------------------

    def settle(self) -> None:
        """Let every coroutine run to its end, the engine finishing its request; a dead
        process's reply is found by the next sweep."""
        for _ in range(200):
            if not self.alive:
                break
            if self.beat == "answered":
                self.heartbeat_answer()
            elif self.pc == "queued":
                self.take()
            elif self.pc == "prepare":
                self.prompt_built()
            elif self.pc == "generating":
                self.engine_step("stop")
            elif self.pc == "flush":
                self.flush_and_begin_finish()
            elif self.pc == "writing":
                self.final_write()
            elif self.pc == "announcing":
                self.publish_done()
        assert not self.alive, "the run never ended"
        if self.pc == "dead":
            self.sweep()

    def heard_events(self) -> list[dict]:
        async def drain():
            events = []
            while True:
                try:
                    message = await asyncio.wait_for(self.layer.receive(self.channel), 0.02)
                except TimeoutError:
                    return events
                events.append(message["event"])

        return self.run_async(drain())

    def teardown(self):
        try:
            if getattr(self, "run", None) is None:
                return
            self.settle()
            events = self.heard_events()
            self.run_async(self.layer.group_discard(self.group, self.channel))
            self.check(events)
        finally:
            self.loop.close()

    def check(self, events: list[dict]) -> None:
        row = Message.objects.get(pk=self.reply.pk)
        assert not row.is_active, f"the reply's row is left {row.status}"
        dones = [e for e in events if e["type"] == "message.done"]
        if self.pc == "dead" and self.died_at == "announcing" and not dones:
            # Died between its final write and its message.done: no process can tell the
            # two apart from a done sent. The page's socket died with the process; it
            # reconnects and reads the final row (chat.js resync).
            return
        assert len(dones) == 1, f"{len(dones)} message.done for one reply: {events}"
        done = dones[0]
        assert done["message"]["status"] == row.status
        # The reply starts at most once, and never after its end (a page would show an
        # ended reply streaming again).
        starts = [i for i, e in enumerate(events) if e["type"] == "message.started"]
        assert len(starts) <= 1 and all(i < events.index(done) for i in starts), events
        deltas = [e for e in events if e["type"] == "message.delta"]
        assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
        # A run that learnt the reply is another's says nothing more about it.
        assert self.deltas_after_told == 0
        if self.pc == "dead":
            assert done["seq"] == 0  # announced by the sweep
            return
        assert self.run.state in FINAL_STATES
        if self.run.state == RunState.INTERRUPTED:
            assert done["seq"] == 0  # the record and its done are the sweep's
            return
        # This run wrote the record: its done follows its deltas, with their whole text.
        assert done["seq"] == len(deltas) + 1
        assert {RunState.DONE: "done", RunState.STOPPED: "stopped",
                RunState.FAILED: "error"}[self.run.state] == row.status
        assert "".join(d["text"] for d in deltas) == row.content
        if self.stop_before_end:
            assert row.status == Message.Status.STOPPED


@pytest.fixture
def machine(alice):
    ReplyRunMachine.owner = alice
    ReplyRunMachine.tokenizer = get_tokenizer()
    return ReplyRunMachine


def test_every_order_of_a_replys_events_ends_it_once_with_one_done(machine):
    run_state = machine.TestCase
    # Derandomized, without an example database: every run explores the same orders.
    run_state.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                  derandomize=True, database=None,
                                  suppress_health_check=list(HealthCheck))
    run_state().runTest()
