"""Random admit / grow / share / free / evict sequences against a pool shared by KV
groups (inference/kv_groups.py): one full group and two sliding ones of window 6 over
blocks of 4 tokens."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inference.kv_cache_manager import KVCacheManager
from inference.kv_groups import RELEASED, kv_groups
from inference.sampling_params import SamplingParams
from inference.sequence import Sequence

BS = 4
NUM_PAGES = 40
WINDOWS = [6, None, 6]  # groups: (1,) full, (0,) and (2,) sliding
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 9, 9, 9, 9], [5] * 10]


class GroupedPoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(NUM_PAGES, BS, groups=kv_groups(WINDOWS))
        # What each page holds, as the model would have written it: (group, position,
        # token) per slot, None where nothing was written.
        self.pages: list[list[tuple | None]] = [[None] * BS for _ in range(NUM_PAGES)]
        self.live: list[Sequence] = []
        self.next_id = 0

    def tables(self, seq: Sequence) -> list[list[int]]:
        return [seq.block_table, *seq.group_tables]

    def _compute(self, seq: Sequence, upto: int) -> None:
        """A step: every group's page gets the K/V of positions num_computed..upto-1,
        which must have been given pages; then the full blocks are cached."""
        for g, table in enumerate(self.tables(seq)):
            for pos in range(seq.num_computed_tokens, upto):
                page = table[pos // BS]
                assert page != RELEASED
                self.pages[page][pos % BS] = (g, pos, seq.token_ids[pos])
        seq.num_computed_tokens = upto
        self.kv.cache_computed_blocks(seq)

    def _check_reads(self, seq: Sequence, upto: int) -> None:
        """Every key the next queries (positions num_computed..upto-1) read in each
        group is the sequence's own token at that position, in that group."""
        groups = self.kv.groups
        for g, table in enumerate(self.tables(seq)):
            lo = groups.first_needed_block(g, seq.num_computed_tokens, BS) * BS
            for pos in range(lo, seq.num_computed_tokens):
                page = table[pos // BS]
                assert page != RELEASED, (g, pos)
                assert self.pages[page][pos % BS] == (g, pos, seq.token_ids[pos])

    def _admit(self, seq: Sequence, chunk: int) -> bool:
        hits = self.kv.find_cached_blocks(seq)
        n = min(seq.num_tokens - len(hits) * BS, chunk)
        if not self.kv.can_admit(hits, n):
            return False
        self.kv.admit(seq, hits, n)
        assert seq.num_computed_tokens == len(hits) * BS
        self._check_reads(seq, seq.num_computed_tokens + n)
        self._compute(seq, seq.num_computed_tokens + n)
        self.live.append(seq)
        return True

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(10, 13), max_size=12),
          salt=st.sampled_from([None, "t1"]), chunk=st.integers(1, 12))
    def allocate(self, prefix, tail, salt, chunk):
        seq = Sequence(f"r{self.next_id}", 0, prefix + tail, SamplingParams(), salt)
        self.next_id += 1
        self._admit(seq, chunk)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), k=st.integers(1, 6), chunk=st.integers(1, 8))
    def append(self, data, k, chunk):
        """Decode (or continue a chunked prefill) by up to `chunk` tokens."""
        seq = data.draw(st.sampled_from(self.live))
        if seq.num_computed_tokens == seq.num_tokens:
            for _ in range(k):
                seq.append_token(data.draw(st.integers(10, 13)))
        n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        if not self.kv.can_grow(seq, n):
            return
        self.kv.grow(seq, n)
        self._check_reads(seq, seq.num_computed_tokens + n)
        self._compute(seq, seq.num_computed_tokens + n)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def share(self, data):
        """A new request with a live one's computed tokens plus one more hits every
        full computed block where the live one still holds the sliding groups' window
        before them (it released older pages, which eviction may have taken)."""
        src = data.draw(st.sampled_from(self.live))
        seq = Sequence(f"r{self.next_id}", 0, src.token_ids[: src.num_computed_tokens] + [11],
                       SamplingParams(), src.cache_salt)
        self.next_id += 1
        hits = self.kv.find_cached_blocks(seq)
        k = (seq.num_tokens - 1) // BS
        groups = self.kv.groups
        held = all(table[i] != RELEASED for g, table in enumerate(self.tables(src))
                   for i in range(groups.first_needed_block(g, k * BS, BS), k))
        assert len(hits) == k if held else len(hits) <= k
        self._admit(seq, 64)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.kv.free(seq)

    @rule()
    def evict_by_pressure(self):
        """Take every free page (evicting cached ones), then give them back."""
        pool = self.kv.pool
        taken = pool.allocate(pool.num_free_blocks)
        for b in taken:
            self.pages[b.block_id] = [None] * BS
        pool.free(reversed(taken))

    @invariant()
    def accounting_holds(self):
        pool, groups = self.kv.pool, self.kv.groups
        refs = [0] * NUM_PAGES
        for seq in self.live:
            for g, table in enumerate(self.tables(seq)):
                assert len(table) == len(seq.block_table)
                # A sliding group holds no page before the window of its next query.
                lo = groups.first_needed_block(g, seq.num_computed_tokens, BS)
                for i, page in enumerate(table):
                    if page == RELEASED:
                        assert i < lo
                    else:
                        refs[page] += 1
        for block in pool.blocks:
            assert block.ref_cnt == refs[block.block_id]
            assert (block.block_id in pool.free_queue) == (block.ref_cnt == 0)
        assert pool.num_free_blocks + sum(1 for r in refs if r) == NUM_PAGES
        # A cached page holds its block's tokens, written by its own group.
        for holders in pool.cached.values():
            for block in holders.values():
                written = self.pages[block.block_id]
                assert all(w is not None for w in written)
                assert [w[2] for w in written] == list(block.token_ids)
                assert len({w[0] for w in written}) == 1
                # Keyed under that group: (group, chained hash).
                g = written[0][0]
                assert block.block_hash[32:] == (b"" if g == 0 else g.to_bytes(2, "big"))


GroupedPoolMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGroupedPool = GroupedPoolMachine.TestCase
