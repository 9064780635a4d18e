"""Prefix blocks that a scheduled request is computing right now.

When requests with the same long prefix (a system prompt) arrive together on a
fresh engine, none of that prefix is cached yet when they are scheduled, and each
would compute it. Instead, a waiting request whose next block, by its chained
hash (same tokens from the start, same cache_salt, same model), is one a request
scheduled in this step computes:

- shares it at once if that block is complete by the end of this step: within a
  step every layer stores the K/V of all the step's tokens before any of them
  attends (inference/models/llama.py), so a chunk can attend to blocks that
  another sequence's chunk writes in the same step. The block is taken like a
  prefix-cache hit (a reference, no copy); its producer names it in the cache
  after the step, as usual;
- waits otherwise (the producer writes it in a later chunk), and is admitted as
  soon as every block it shares is complete. Meanwhile requests behind it that
  share nothing are admitted as usual.

A request waits only on one that computes tokens in the current step, so a
producer that is preempted, aborted or finished, or that got no budget, holds
no-one back: the waiter is then admitted as usual and computes what is missing
itself. The map is rebuilt every step and owns no blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.block_pool import Block, BlockPool
from inference.sequence import Sequence


@dataclass
class InflightBlock:
    producer: Sequence
    block_id: int | None  # set when the block is complete by the end of this step


class InflightBlocks:
    """hash -> the block a sequence scheduled in this step writes, for every block
    those sequences have hashed (a prompt's full blocks are hashed at admission)
    but not yet cached."""

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self._blocks: dict[bytes, InflightBlock] = {}

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        """seq computes num_new_tokens after its computed ones in this step (its
        blocks for them are allocated)."""
        complete = (seq.num_computed_tokens + num_new_tokens) // self.block_size
        for i in range(seq.num_cached_blocks, len(seq.block_hashes)):
            ready = seq.block_table[i] if i < complete else None
            self._blocks.setdefault(seq.block_hashes[i], InflightBlock(seq, ready))

    def extend_hits(self, seq: Sequence, hits: list[Block], max_blocks: int) -> bool:
        """Append to waiting seq's cache hits the blocks complete by the end of this
        step that continue them; False when its next block is still to be written
        by a later chunk of a scheduled sequence (it should wait a step), True when
        it may be admitted with the hits as extended. max_blocks caps the hits
        (its last token must be computed)."""
        limit = min(max_blocks, len(seq.block_hashes))
        while len(hits) < limit:
            found = self._blocks.get(seq.block_hashes[len(hits)])
            if found is None or found.producer is seq:
                return True
            if found.block_id is None:
                return False
            hits.append(self.pool.blocks[found.block_id])
        return True
