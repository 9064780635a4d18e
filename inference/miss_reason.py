"""Why a prompt's prefix-cache match ended where it did: the engine's half of a receipt.

A bounded record of every block hash this engine computed tells a block that was
evicted from one that was never seen. Those hashes are salted, so "evicted" speaks
only of the asking tenant's own blocks. A second record, of the same chains hashed
without the cache salt, tells a miss whose tokens another tenant computed: that is
counted in the engine's aggregate metrics only. The request's own receipt says
"cold" then, as for tokens nobody sent, or it would confirm another tenant's prompt
(a membership oracle: the receipt form of vLLM's CVE-2025-46570).
"""

from __future__ import annotations

from collections import OrderedDict

from inference.block_pool import hash_block
from inference.outputs import PrefixCacheRecord
from inference.sequence import Sequence

FULL = "full"  # every cacheable block hit
EVICTED = "evicted"  # the next block was computed once and evicted (see evicted_from)
COLD = "cold"  # this tenant (cache_salt) never had the next block computed here
DISABLED = "disabled"  # prefix caching is off
REASONS = (FULL, EVICTED, COLD, DISABLED)  # what a request's receipt may say
# An aggregate metric label only, never a receipt: a cold miss whose tokens were
# computed under another cache_salt.
SALT = "salt"


def disabled_record() -> PrefixCacheRecord:
    return PrefixCacheRecord(matched_tokens=0, tier_tokens=0, reason=DISABLED)


class BoundedSet:
    """A set that forgets its least recently added or checked members past `capacity`."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[bytes, None] = OrderedDict()

    def add(self, key: bytes) -> None:
        self._items[key] = None
        self._items.move_to_end(key)
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def discard(self, key: bytes) -> None:
        self._items.pop(key, None)

    def __contains__(self, key: bytes) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()


class PrefixHistory:
    def __init__(self, capacity: int, block_size: int, model_id: str = "",
                 hash_algorithm: str = "sha256"):
        self.block_size = block_size
        self.model_id = model_id
        self.hash_algorithm = hash_algorithm
        self.computed = BoundedSet(capacity)  # salted chain hashes ever computed
        self.unsalted = BoundedSet(capacity)  # the same chains hashed without the salt
        self.tier_dropped = BoundedSet(capacity)  # hashes the host/disk tier let go

    def clear(self) -> None:
        self.computed.clear()
        self.unsalted.clear()
        self.tier_dropped.clear()

    def _unsalted(self, seq: Sequence, i: int) -> bytes:
        """Block i's chain hash without the salt: the no-salt tenant's hash of those tokens."""
        if seq.cache_salt is None:
            return seq.block_hashes[i]
        chain = seq.unsalted_block_hashes
        size = self.block_size
        extra = (self.model_id, None)
        while len(chain) <= i:
            j = len(chain)
            parent = chain[-1] if chain else None
            chain.append(hash_block(parent, seq.token_ids[j * size : (j + 1) * size], extra,
                                    self.hash_algorithm))
        return chain[i]

    def record_computed(self, seq: Sequence, start: int, end: int) -> None:
        """Blocks start..end-1 of seq now hold computed K/V."""
        for i in range(start, end):
            h = seq.block_hashes[i]
            self.computed.add(h)
            self.tier_dropped.discard(h)
            self.unsalted.add(self._unsalted(seq, i))

    def explain(self, seq: Sequence, matched_blocks: int, max_blocks: int,
                tier_blocks: int, tier=None) -> tuple[PrefixCacheRecord, bool]:
        """The receipt of a lookup that matched `matched_blocks` of `max_blocks` cacheable
        ones, and whether its cold miss was on tokens another tenant computed. Only the
        receipt may reach the request; the flag is for the engine's aggregate counts."""
        bs = self.block_size
        record = PrefixCacheRecord(matched_tokens=matched_blocks * bs, tier_tokens=tier_blocks * bs,
                                   reason=FULL)
        if matched_blocks >= max_blocks:
            return record, False
        # Salted: only this tenant's own computed blocks make a miss "evicted".
        h = seq.block_hashes[matched_blocks]
        if h in self.computed or (tier is not None and h in tier):
            record.reason = EVICTED
            dropped = tier is not None and h in self.tier_dropped and h not in tier
            record.evicted_from = "tier" if dropped else "pool"
            return record, False
        record.reason = COLD
        return record, self._unsalted(seq, matched_blocks) in self.unsalted
