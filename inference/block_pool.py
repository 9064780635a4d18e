"""KV blocks, their reference counts, and the prefix cache over them.

A full block is known by a hash chained from its parent's, so one hash names
the whole prefix up to and including that block. Freed blocks keep their hash
and wait in an LRU free queue; they are evicted (hash dropped) only when a
fresh block is needed.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

try:  # optional, faster, 128-bit
    import xxhash
except ImportError:  # pragma: no cover - depends on the environment
    xxhash = None

ROOT_HASH = b"prefixchat-root"


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids", "from_tier")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        # The tokens the hash names, kept for checks and the dashboard.
        self.token_ids: tuple[int, ...] | None = None
        # Copied back from the host/disk tier and not yet counted by a request's receipt.
        self.from_tier = False

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


def hash_block(
    parent_hash: bytes | None,
    token_ids: Sequence[int],
    extra_keys: tuple = (),
    algorithm: str = "sha256",
) -> bytes:
    """H(parent_hash, token_ids, extra_keys); extra_keys hold the model id and cache salt."""
    payload = b"".join((
        parent_hash or ROOT_HASH,
        np.asarray(token_ids, dtype=np.int64).tobytes(),
        repr(extra_keys).encode(),
    ))
    if algorithm == "xxhash":
        if xxhash is None:
            raise RuntimeError("hash algorithm 'xxhash' needs the xxhash package")
        return xxhash.xxh3_128_digest(payload)
    # Lengths are fixed except extra_keys, which ends the payload, so no ambiguity.
    return hashlib.sha256(payload).digest()


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Insertion order = eviction order: the front is evicted first.
        self.free_queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        # hash -> the blocks holding that content. Usually one; two sequences that
        # compute the same block at once give two, and when one of them is evicted
        # the other must stay findable.
        self.cached: dict[bytes, dict[int, Block]] = {}
        self.num_evictions = 0
        # Called with a cached block about to lose its hash (its K/V still intact), so
        # a lower tier can keep a copy (inference/kv_offload.py).
        self.on_evict: Callable[[Block], None] | None = None

    # --- queries -------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return sum(1 for b in self.free_queue.values() if b.block_hash is not None)

    def lookup(self, block_hash: bytes) -> Block | None:
        if not self.enable_caching:
            return None
        holders = self.cached.get(block_hash)
        return next(iter(holders.values())) if holders else None

    # --- changes -------------------------------------------------------------
    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on cache hits, pulling free ones out of the free queue."""
        for b in blocks:
            if b.ref_cnt == 0:
                del self.free_queue[b.block_id]
            b.ref_cnt += 1

    def allocate(self, n: int) -> list[Block]:
        """n fresh blocks from the front of the free queue, evicting their hashes."""
        if n > len(self.free_queue):
            raise RuntimeError(f"asked for {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            _, b = self.free_queue.popitem(last=False)
            self._evict(b)
            b.ref_cnt = 1
            out.append(b)
        return out

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference each; cached blocks reaching 0 join the back of the free
        queue, blocks without a hash its front.

        Callers pass a sequence's blocks tail first, so a chain's deeper blocks are
        evicted before the shallower ones that other prompts are likelier to share. A
        block without a hash (a partial tail, a block of a cache-less engine) holds
        nothing a prompt can hit: reused first, it spares a cached block its eviction
        and an untouched part of the pool its first page (the CPU pool is mapped as
        written).
        """
        for b in blocks:
            if b.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {b.block_id}")
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_queue[b.block_id] = b
                if b.block_hash is None:
                    self.free_queue.move_to_end(b.block_id, last=False)

    def cache_block(self, block: Block, block_hash: bytes, token_ids: Sequence[int]) -> None:
        """Name a full, computed block by its hash so later prompts can hit it."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        block.token_ids = tuple(token_ids)
        self.cached.setdefault(block_hash, {})[block.block_id] = block

    def _evict(self, b: Block) -> None:
        if b.block_hash is None:
            return
        holders = self.cached.get(b.block_hash)
        if holders is not None and holders.pop(b.block_id, None) is not None:
            self.num_evictions += 1
            if not holders:
                del self.cached[b.block_hash]
                if self.on_evict is not None:  # the last copy in the pool
                    self.on_evict(b)
        b.block_hash = None
        b.token_ids = None
        b.from_tier = False

    def reset_prefix_cache(self) -> int:
        """Forget every hash; returns how many blocks were cached. Running requests go on."""
        n = sum(len(holders) for holders in self.cached.values())
        for b in self.blocks:
            b.block_hash = None
            b.token_ids = None
            b.from_tier = False
        self.cached.clear()
        return n
