"""Continuous batching: which sequences compute how many tokens in the next step."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inference.config import EngineConfig
from inference.inflight import InflightBlocks
from inference.kv_cache_manager import KVCacheManager
from inference.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)  # tokens each computes now
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.seqs


class Scheduler:
    """Running sequences go first (decodes and unfinished prefill chunks), then new
    ones while the token budget and blocks last; a new one whose next prefix blocks a
    scheduled sequence is computing shares or waits for them (inference/inflight.py). When
    blocks run out, the newest running sequence is preempted: its blocks are freed
    (its full blocks usually stay cached, so it re-hits) and it is recomputed later."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.lone_prefill_tokens = config.lone_prefill_tokens
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # Admissions put off because a scheduled request was computing their blocks,
        # and blocks shared while a scheduled request computed them.
        self.num_prefix_waits = 0
        self.num_inflight_shared_blocks = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        # A step of one sequence holds no other up: its prefill takes bigger chunks.
        lone = len(self.running) + len(self.waiting) == 1
        budget = self.lone_prefill_tokens if lone else self.max_num_batched_tokens
        pending = list(self.running)
        kept: list[Sequence] = []
        while pending:
            seq = pending.pop(0)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n <= 0:
                kept.append(seq)
                continue
            while not self.kv.can_grow(seq, n):
                victim = pending.pop() if pending else seq
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            self.kv.grow(seq, n)
            out.seqs.append(seq)
            out.num_tokens.append(n)
            kept.append(seq)
            budget -= n
        self.running = kept

        if not out.preempted:
            self._admit_waiting(out, budget)
        return out

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        skipped: list[Sequence] = []
        inflight = self._inflight(out) if self.waiting and budget > 0 else None
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            parent = seq.wait_for
            if parent is not None and not parent.is_finished and (
                parent.num_computed_tokens < parent.num_prompt_tokens
            ):
                # A sibling sample waits for its prompt's blocks, then shares them.
                skipped.append(self.waiting.popleft())
                continue
            hits = self.kv.find_cached_blocks(seq)
            num_cached = len(hits)
            if inflight is not None and not inflight.extend_hits(
                seq, hits, seq.cacheable_tokens() // self.kv.block_size
            ):
                # Its next blocks are being computed for another request: it shares
                # them once they are complete.
                self.num_prefix_waits += 1
                skipped.append(self.waiting.popleft())
                continue
            n = min(seq.num_tokens - len(hits) * self.kv.block_size, budget)
            if not self.kv.can_admit(hits, n):
                break
            self.waiting.popleft()
            self.kv.admit(seq, hits, n)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.seqs.append(seq)
            out.num_tokens.append(n)
            budget -= n
            if inflight is not None:
                self.num_inflight_shared_blocks += len(hits) - num_cached
                inflight.add(seq, n)
        self.waiting.extendleft(reversed(skipped))

    def _inflight(self, out: SchedulerOutput) -> InflightBlocks | None:
        """The uncached blocks of this step's sequences, which a waiting request
        sharing them shares or waits for (inference/inflight.py); None without
        prefix caching."""
        if not self.kv.enable_caching or self.kv.hybrid:
            # A hybrid model's blocks are per KV group; its requests compute a shared
            # prefix each and meet in the cache afterwards.
            return None
        inflight = InflightBlocks(self.kv.pool, self.kv.block_size)
        for seq, n in zip(out.seqs, out.num_tokens, strict=True):
            inflight.add(seq, n)
        return inflight

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        """Take a sequence out of the queues and release its blocks."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.error = error
