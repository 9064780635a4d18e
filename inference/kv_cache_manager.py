"""Per-sequence block bookkeeping on top of the block pool: hits, growth, release.

A hybrid model (inference/kv_groups.py) has several KV groups, each with its own
block table per sequence and pages from the one pool. The pool names a group's page
by (group, chained hash), the same hashes naming every group. A sliding group
releases the pages that fell out of its window as the sequence advances (they keep
their hash in the free queue), and a prefix hit of k blocks needs the full groups'
blocks 0..k-1 and only the sliding groups' blocks under the window before position
k * block_size: the longest k for which both hold.
"""

from __future__ import annotations

from inference.block_pool import Block, BlockPool, hash_block
from inference.kv_groups import RELEASED, KVGroups, whole
from inference.kv_offload import KVTier
from inference.miss_reason import PrefixHistory, disabled_record
from inference.sequence import Sequence


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        hash_algorithm: str = "sha256",
        model_id: str = "",
        groups: KVGroups | None = None,
    ):
        self.block_size = block_size
        self.groups = groups or whole(1)
        self.hybrid = self.groups.hybrid
        self.pool = BlockPool(num_blocks, enable_caching)
        self.enable_caching = enable_caching
        self.hash_algorithm = hash_algorithm
        self.model_id = model_id
        # Prefix-cache counters in tokens, as vLLM counts them.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prefix_cache_hits_tier = 0  # of the hits, copied back from the host/disk tier
        # What was ever computed, to say why a match ended (inference/miss_reason.py).
        self.history = PrefixHistory(max(1 << 14, 8 * num_blocks), block_size, model_id,
                                     hash_algorithm) if enable_caching else None
        # The host/disk tier under the pool (attach_tier), or None.
        self.tier: KVTier | None = None

    # --- the tier under the pool ----------------------------------------------
    def attach_tier(self, tier: KVTier) -> None:
        """Put `tier` under the pool: evictions offload into it, lookups continue into it."""
        if self.hybrid:
            raise ValueError("the host/disk KV tier holds one block table's layout; a model "
                             "with sliding-window KV groups cannot take it")
        self.tier = tier
        self.pool.on_evict = tier.offload
        history = self.history
        if history is None:
            return
        for h in tier.persisted_hashes():  # computed before a restart: a miss there is an eviction
            history.computed.add(h)
        # The history must outlive what the tier holds, or a tier miss reads as "never seen".
        capacity = tier.capacity_blocks
        for s in (history.computed, history.unsalted, history.tier_dropped):
            s.capacity = min(max(s.capacity, 2 * capacity + 8 * self.pool.num_blocks), 1 << 20)
        tier.on_drop = history.tier_dropped.add

    def _continue_in_tier(self, seq: Sequence, hits: list[Block], max_blocks: int,
                          budget: int | None = None) -> list[Block]:
        """Extend a run of pool hits through the tier (and the pool again after a restored
        run), up to max_blocks, restoring at most `budget` blocks. Restored blocks are
        counted as cached tokens by the request that admits them."""
        tier = self.tier
        assert tier is not None
        pool, hashes = self.pool, seq.block_hashes
        hits = list(hits)
        budget = max_blocks if budget is None else budget
        while len(hits) < max_blocks:
            b = pool.lookup(hashes[len(hits)])
            if b is not None:
                hits.append(b)
                continue
            restored = tier.restore(pool, hashes[len(hits) : max_blocks], seq.token_ids,
                                    len(hits), hits, min(budget, max_blocks - len(hits)))
            if not restored:
                break
            budget -= len(restored)
            hits.extend(restored)
        return hits

    def prewarm(self, seq: Sequence, max_blocks: int) -> int:
        """Bring seq's blocks that sit in the tier back into the pool, as cached free blocks,
        ahead of the request that will use them; at most max_blocks restored (and at most
        half the pool). Returns how many were restored (0 without a tier)."""
        if self.tier is None or max_blocks <= 0:
            return 0
        self.update_block_hashes(seq)
        before = self.tier.restores
        budget = min(max_blocks, self.pool.num_blocks // 2)
        self._continue_in_tier(seq, [], len(seq.block_hashes), budget)
        return self.tier.restores - before

    # --- hashing -------------------------------------------------------------
    def _extra_keys(self, seq: Sequence) -> tuple:
        return (self.model_id, seq.cache_salt)

    def update_block_hashes(self, seq: Sequence) -> None:
        """Extend seq.block_hashes over every full block of its known tokens."""
        bs = self.block_size
        extra = self._extra_keys(seq)
        while (len(seq.block_hashes) + 1) * bs <= seq.num_tokens:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            tokens = seq.token_ids[i * bs : (i + 1) * bs]
            seq.block_hashes.append(hash_block(parent, tokens, extra, self.hash_algorithm))

    # --- admission -----------------------------------------------------------
    def find_cached_blocks(self, seq: Sequence) -> list[Block]:
        """Longest run of cached blocks from the start, leaving the last token to compute."""
        if not self.enable_caching:
            return GroupHits([], [[] for _ in self.groups.layers]) if self.hybrid else []
        self.update_block_hashes(seq)
        # The last token must be computed to produce logits (and a prompt being scored,
        # every position it scores), so cap the hit below it.
        max_blocks = seq.cacheable_tokens() // self.block_size
        if self.hybrid:
            return self._find_group_hits(seq, max_blocks)
        hits: list[Block] = []
        for h in seq.block_hashes[:max_blocks]:
            b = self.pool.lookup(h)
            if b is None:
                break
            hits.append(b)
        if self.tier is not None and len(hits) < max_blocks:
            hits = self._continue_in_tier(seq, hits, max_blocks)
        return hits

    def _key(self, group: int, block_hash: bytes) -> bytes:
        """The pool's name for a group's page: group 0 keeps the chained hash itself
        (a model with one group is keyed as it always was), group g appends g."""
        return block_hash if group == 0 else block_hash + group.to_bytes(2, "big")

    def _find_group_hits(self, seq: Sequence, max_blocks: int) -> GroupHits:
        """The longest k <= max_blocks such that every full group holds blocks 0..k-1
        and every sliding group the blocks a query at position k * block_size reads."""
        pool, hashes, bs, groups = self.pool, seq.block_hashes, self.block_size, self.groups
        found: list[list[Block | None]] = [[] for _ in groups.layers]
        k = 0
        while k < max_blocks:
            blocks = [pool.lookup(self._key(g, hashes[k])) for g in groups.full]
            if any(b is None for b in blocks):
                break
            for g, b in zip(groups.full, blocks, strict=True):
                found[g].append(b)
            k += 1
        # Shorten k until every sliding group holds the window before k * block_size: a
        # page missing at index j fails every k' in (j, k] (their windows reach back to
        # j too), so the next candidate is j.
        while k > 0:
            missing = -1
            for g in groups.sliding:
                for i in range(k - 1, groups.first_needed_block(g, k * bs, bs) - 1, -1):
                    if pool.lookup(self._key(g, hashes[i])) is None:
                        missing = max(missing, i)
                        break
            if missing < 0:
                break
            k = missing
        tables: list[list[Block | None]] = []
        for g in range(groups.num_groups):
            lo = groups.first_needed_block(g, k * bs, bs)
            if groups.windows[g] is None:
                tables.append(found[g][:k])
            else:
                tables.append([None] * lo + [pool.lookup(self._key(g, hashes[i]))
                                             for i in range(lo, k)])
        return GroupHits(tables[0], tables)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_admit(self, hits: list[Block], num_new_tokens: int) -> bool:
        if self.hybrid:
            assert isinstance(hits, GroupHits)
            touched = {b.block_id for t in hits.tables for b in t if b is not None}
            free_hits = sum(1 for i in touched if self.pool.blocks[i].ref_cnt == 0)
            k = len(hits)
            per_group = self._blocks_for(k * self.block_size + num_new_tokens) - k
            return per_group * self.groups.num_groups <= self.pool.num_free_blocks - free_hits
        # Hit blocks sitting in the free queue stop being free once touched.
        free_hits = sum(1 for b in hits if b.ref_cnt == 0)
        need = self._blocks_for(len(hits) * self.block_size + num_new_tokens) - len(hits)
        return need <= self.pool.num_free_blocks - free_hits

    def admit(self, seq: Sequence, hits: list[Block], num_new_tokens: int) -> None:
        """Give a waiting sequence its hit blocks and fresh ones for its first chunk."""
        assert not seq.block_table
        if self.hybrid:
            assert isinstance(hits, GroupHits)
            for t in hits.tables[1:]:
                self.pool.touch(b for b in t if b is not None)
            seq.group_tables = [[RELEASED if b is None else b.block_id for b in t]
                                for t in hits.tables[1:]]
            seq.group_released = [0] * (self.groups.num_groups - 1)
        self.pool.touch(b for b in hits if b is not None)
        tier_blocks = sum(1 for b in hits if b is not None and b.from_tier)
        for b in hits:
            if b is not None:
                b.from_tier = False  # counted once, by the request that first uses it
        self.prefix_cache_hits_tier += tier_blocks * self.block_size
        if seq.num_cached_tokens is None:  # the receipt of its first admission
            # A prompt scored for its own logprobs reads nothing from the cache.
            if self.history is None or seq.cacheable_tokens() < seq.num_tokens - 1:
                seq.prefix_cache = disabled_record()
            else:
                seq.prefix_cache, seq.cross_tenant_miss = self.history.explain(
                    seq, len(hits), (seq.num_tokens - 1) // self.block_size, tier_blocks,
                    self.tier)
        seq.block_table = [RELEASED if b is None else b.block_id for b in hits]
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_cached_blocks = len(hits)
        self.prefix_cache_queries += seq.num_tokens
        self.prefix_cache_hits += seq.num_computed_tokens
        self.grow(seq, num_new_tokens)

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        if self.hybrid:
            self.release_out_of_window(seq)
            need = self._new_blocks(seq, num_new_tokens) * self.groups.num_groups
            return need <= self.pool.num_free_blocks
        return self._new_blocks(seq, num_new_tokens) <= self.pool.num_free_blocks

    def grow(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make room for num_new_tokens more tokens after the computed ones."""
        if self.hybrid:
            self.release_out_of_window(seq)
        need = self._new_blocks(seq, num_new_tokens)
        if need > 0:
            seq.block_table.extend(b.block_id for b in self.pool.allocate(need))
            for table in seq.group_tables:
                table.extend(b.block_id for b in self.pool.allocate(need))

    def release_out_of_window(self, seq: Sequence) -> None:
        """Give back each sliding group's pages that no query from the next computed
        token on reads. Their hashes stay: a later prompt may still hit them."""
        groups, bs = self.groups, self.block_size
        tables = self._tables(seq)
        for g in groups.sliding:
            lo = min(groups.first_needed_block(g, seq.num_computed_tokens, bs), len(tables[g]))
            table = tables[g]
            start = seq.group_released[g - 1] if g else 0
            freed = []
            for i in range(start, lo):
                if table[i] != RELEASED:
                    freed.append(self.pool.blocks[table[i]])
                    table[i] = RELEASED
            self.pool.free(freed)
            if g:
                seq.group_released[g - 1] = max(start, lo)

    def _tables(self, seq: Sequence) -> list[list[int]]:
        return [seq.block_table, *seq.group_tables]

    def _new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, self._blocks_for(total) - len(seq.block_table))

    # --- after a step --------------------------------------------------------
    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register every full block whose KV is now written, prompt and reply alike."""
        if not self.enable_caching:
            return
        self.update_block_hashes(seq)
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_hashes), len(seq.block_table))
        # Blocks before num_cached_blocks were registered in an earlier step.
        for g, table in enumerate(self._tables(seq)):
            for i in range(seq.num_cached_blocks, full):
                if table[i] == RELEASED:
                    continue
                block = self.pool.blocks[table[i]]
                self.pool.cache_block(block, self._key(g, seq.block_hashes[i]),
                                      seq.token_ids[i * bs : (i + 1) * bs])
        if self.history is not None and full > seq.num_cached_blocks:
            self.history.record_computed(seq, seq.num_cached_blocks, full)
        seq.num_cached_blocks = max(seq.num_cached_blocks, full)

    def free(self, seq: Sequence) -> None:
        """Release a sequence's blocks, tail first (see BlockPool.free); a hybrid
        model's groups block by block, so a chain's deeper pages go first in all."""
        tables = self._tables(seq)
        width = max(len(t) for t in tables)
        self.pool.free(self.pool.blocks[t[i]] for i in reversed(range(width)) for t in tables
                       if i < len(t) and t[i] != RELEASED)
        seq.block_table = []
        seq.group_tables = []
        seq.group_released = []
        seq.num_computed_tokens = 0
        seq.num_cached_blocks = 0


class GroupHits(list):
    """A hybrid model's prefix hit: as a list, group 0's blocks (k of them, None where
    released); `tables` holds every group's, None where a sliding group needs no page."""

    def __init__(self, first: list[Block | None], tables: list[list[Block | None]]):
        super().__init__(first)
        self.tables = tables
