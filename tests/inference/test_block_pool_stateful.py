"""Random allocate / share / append / free / evict / prewarm sequences against the block
pool and the host tier under it (offload on eviction, restore on lookup)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inference.kv_cache_manager import KVCacheManager
from inference.kv_offload import DiskStore, KVTier
from inference.sampling_params import SamplingParams
from inference.sequence import Sequence

BS = 4
NUM_BLOCKS = 24
TIER_BLOCKS = 6  # the host tier holds this many blocks
# A few shared prefixes so that prompts hit each other's blocks.
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5, 5, 5]]


class BlockPoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BS, enable_caching=True)
        # The KV cache as the model would have written it: K = token id, V = token id
        # + 100, -1 where nothing was written. The tier copies these values out and back.
        self.cache = torch.full((2, 1, NUM_BLOCKS, BS, 1, 1), -1.0)
        self.tier = self.make_tier()
        self.kv.attach_tier(self.tier)
        self.live: list[Sequence] = []
        # The tokens each computed block hash names.
        self.known: dict[bytes, list[int]] = {}
        self.next_id = 0

    def make_tier(self) -> KVTier:
        return KVTier(self.cache, TIER_BLOCKS * self.cache[:, :, 0].numel() * 4)

    def slots(self, b: int) -> list[int | None]:
        k, v = self.cache[0, 0, b, :, 0, 0].tolist(), self.cache[1, 0, b, :, 0, 0].tolist()
        assert all(y == x + 100 for x, y in zip(k, v, strict=True) if x >= 0)
        return [int(x) if x >= 0 else None for x in k]

    def _compute(self, seq: Sequence, upto: int) -> None:
        """Write KV for tokens num_computed..upto-1 into their slots, then register blocks."""
        for pos in range(seq.num_computed_tokens, upto):
            b, t = seq.block_table[pos // BS], seq.token_ids[pos]
            self.cache[0, 0, b, pos % BS] = t
            self.cache[1, 0, b, pos % BS] = t + 100
        seq.num_computed_tokens = upto
        self.kv.cache_computed_blocks(seq)
        for i in range(upto // BS):
            self.known[seq.block_hashes[i]] = seq.token_ids[i * BS : (i + 1) * BS]

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(10, 13), max_size=9),
          salt=st.sampled_from([None, "t1"]), chunk=st.integers(1, 12))
    def allocate(self, prefix, tail, salt, chunk):
        seq = Sequence(f"r{self.next_id}", 0, prefix + tail, SamplingParams(), salt)
        self.next_id += 1
        hits = self.kv.find_cached_blocks(seq)
        n = min(seq.num_tokens - len(hits) * BS, chunk)
        if not self.kv.can_admit(hits, n):
            return
        free_before = self.kv.pool.num_free_blocks
        self.kv.admit(seq, hits, n)
        assert self.kv.pool.num_free_blocks <= free_before
        # Hit blocks, restored ones included, hold exactly the prompt's tokens, under
        # the prompt's own hash (so its salt): never another tenant's block.
        for i, b in enumerate(seq.block_table[: len(hits)]):
            assert self.slots(b) == seq.token_ids[i * BS : (i + 1) * BS]
            assert self.kv.pool.blocks[b].block_hash == seq.block_hashes[i]
        self._compute(seq, seq.num_computed_tokens + n)
        self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), k=st.integers(1, 6))
    def append(self, data, k):
        """Decode (or continue a chunked prefill) by up to k tokens."""
        seq = data.draw(st.sampled_from(self.live))
        if seq.num_computed_tokens == seq.num_tokens:
            for _ in range(k):
                seq.append_token(data.draw(st.integers(10, 13)))
        n = seq.num_tokens - seq.num_computed_tokens
        if not self.kv.can_grow(seq, n):
            return
        self.kv.grow(seq, n)
        self._compute(seq, seq.num_tokens)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def share(self, data):
        """A new request with exactly a live one's computed tokens plus one more."""
        src = data.draw(st.sampled_from(self.live))
        seq = Sequence(f"r{self.next_id}", 0,
                       src.token_ids[: src.num_computed_tokens] + [11],
                       SamplingParams(), src.cache_salt)
        self.next_id += 1
        hits = self.kv.find_cached_blocks(seq)
        assert len(hits) == (seq.num_tokens - 1) // BS  # every full computed block is shared
        n = seq.num_tokens - len(hits) * BS
        if self.kv.can_admit(hits, n):
            self.kv.admit(seq, hits, n)
            self._compute(seq, seq.num_tokens)
            self.live.append(seq)

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(10, 13), max_size=9),
          salt=st.sampled_from([None, "t1"]), extra=st.lists(st.integers(10, 13), max_size=6))
    def share_in_flight(self, prefix, tail, salt, extra):
        """Two requests in one step (inference/inflight.py): the second takes the blocks
        the first completes in this step before they are written or cached, then both
        are computed; its blocks hold its own tokens."""
        from inference.inflight import InflightBlocks

        first = Sequence(f"r{self.next_id}", 0, prefix + tail, SamplingParams(), salt)
        second = Sequence(f"r{self.next_id + 1}", 0,
                          prefix + tail + extra + [11], SamplingParams(), salt)
        self.next_id += 2
        hits = self.kv.find_cached_blocks(first)
        n = first.num_tokens - len(hits) * BS
        if not self.kv.can_admit(hits, n):
            return
        self.kv.admit(first, hits, n)
        inflight = InflightBlocks(self.kv.pool, BS)
        inflight.add(first, n)
        hits2 = self.kv.find_cached_blocks(second)
        assert inflight.extend_hits(second, hits2, (second.num_tokens - 1) // BS)
        assert len(hits2) >= first.num_tokens // BS  # all of first's full blocks
        n2 = second.num_tokens - len(hits2) * BS
        live = [first]
        if self.kv.can_admit(hits2, n2):
            self.kv.admit(second, hits2, n2)
            live.append(second)
        # The step: every token's K/V is written, then the blocks are cached.
        for seq in live:
            self._compute(seq, seq.num_tokens)
        for seq in live:
            for i, b in enumerate(seq.block_table[: seq.num_tokens // BS]):
                assert self.slots(b) == seq.token_ids[i * BS : (i + 1) * BS]
        self.live += live

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.kv.free(seq)

    @rule()
    def evict_by_pressure(self):
        """Take every free block (evicting cached ones), then give them back."""
        pool = self.kv.pool
        taken = pool.allocate(pool.num_free_blocks)
        for b in taken:
            self.cache[:, :, b.block_id] = -1.0
        pool.free(reversed(taken))

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(10, 13), max_size=9),
          salt=st.sampled_from([None, "t1"]), max_blocks=st.integers(0, 4))
    def prewarm(self, prefix, tail, salt, max_blocks):
        """Bring a prompt's blocks back from the tier ahead of a request."""
        seq = Sequence("prewarm", 0, prefix + tail, SamplingParams(), salt)
        free_before = self.kv.pool.num_free_blocks
        restored = self.kv.prewarm(seq, max_blocks)
        assert restored <= max_blocks
        assert self.kv.pool.num_free_blocks == free_before  # restored blocks stay free

    @invariant()
    def accounting_holds(self):
        pool = self.kv.pool
        refs = {b: 0 for b in range(NUM_BLOCKS)}
        for seq in self.live:
            for b in seq.block_table:
                refs[b] += 1
        for block in pool.blocks:
            assert block.ref_cnt >= 0
            assert block.ref_cnt == refs[block.block_id]
            in_free = block.block_id in pool.free_queue
            assert in_free == (block.ref_cnt == 0)  # never both free and referenced
        used = sum(1 for b in pool.blocks if b.ref_cnt > 0)
        assert pool.num_free_blocks + used == NUM_BLOCKS
        assert pool.num_used_blocks == used
        for h, holders in pool.cached.items():
            assert holders
            for block in holders.values():
                assert block.block_hash == h
                assert list(block.token_ids) == self.slots(block.block_id)
        # Every block carrying a hash is findable by it (a duplicate's eviction
        # must not hide the other holder).
        for block in pool.blocks:
            if block.block_hash is not None:
                assert block.block_id in pool.cached[block.block_hash]
            else:
                assert not block.from_tier

    @invariant()
    def tier_holds_what_was_evicted(self):
        tier = self.tier
        assert len(tier.memory) <= TIER_BLOCKS
        assert tier.memory_used_bytes <= tier.memory_bytes
        for h, data in tier.memory.items():
            tokens = self.known[h]  # only computed blocks are ever offloaded
            assert data[0, 0, :, 0, 0].tolist() == tokens
            assert data[1, 0, :, 0, 0].tolist() == [t + 100 for t in tokens]


BlockPoolMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockPool = BlockPoolMachine.TestCase


class BlockPoolDiskMachine(BlockPoolMachine):
    """The same, over a tier of 1 block in memory and about 6 on disk."""

    def make_tier(self) -> KVTier:
        self.dir = tempfile.mkdtemp(prefix="kv-tier-")
        block = self.cache[:, :, 0].numel() * 4
        return KVTier(self.cache, block, self.dir, 6 * (block + 300), model_id="m")

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule()
    def memory_lets_go(self):
        """Host memory drops its copies (they stay on disk): later restores read files."""
        self.tier.memory.clear()

    @invariant()
    def tier_holds_what_was_evicted(self):
        disk = self.tier.disk
        assert len(self.tier.memory) <= 1
        assert disk.bytes <= disk.max_bytes
        files = {p.name: p.stat().st_size for p in Path(self.dir).glob("*.kv")}
        assert files == {h.hex() + ".kv": size for h, size in disk.index.items()}
        for h in disk.index:  # read here without touching the store's LRU order
            path = Path(self.dir) / (h.hex() + ".kv")
            header, offset = DiskStore._read_header(path)
            data = torch.frombuffer(bytearray(path.read_bytes()[offset:]), dtype=torch.float32)
            data = data.reshape(self.tier.block_shape)
            assert header["hash"] == h.hex() and header["model_id"] == "m"
            tokens = self.known[h]
            assert data[0, 0, :, 0, 0].tolist() == tokens
            assert data[1, 0, :, 0, 0].tolist() == [t + 100 for t in tokens]


BlockPoolDiskMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockPoolOverDisk = BlockPoolDiskMachine.TestCase
