"""Prefix blocks that a running request is computing right now.

When requests with the same long prefix (a system prompt) arrive together on a
fresh engine, none of that prefix is cached yet when they are scheduled, and each
would compute it. A waiting request whose next block, by its chained hash (same
tokens from the start, same cache_salt, same model), is one a request scheduled
in this step is computing waits a step instead: once those blocks are computed
and cached it gets them as ordinary prefix-cache hits. With chunked prefill it
starts as soon as the whole part it shares is cached.

A request waits only on one that computes tokens in the current step, so a
producer that is preempted, aborted or finished, or that got no budget, holds
no-one back: the waiter is then admitted as usual and computes what is missing
itself. Nothing here owns blocks; the map is rebuilt every step.
"""

from __future__ import annotations

from inference.sequence import Sequence


class InflightBlocks:
    """hash -> the scheduled sequence that will write that block, for the blocks of
    every sequence scheduled in this step that are hashed but not yet cached."""

    def __init__(self) -> None:
        self._producers: dict[bytes, Sequence] = {}

    def add(self, seq: Sequence) -> None:
        """seq computes tokens in this step: the blocks it has named (its whole prompt's
        full blocks are hashed at admission) but not cached are on their way."""
        for h in seq.block_hashes[seq.num_cached_blocks :]:
            self._producers.setdefault(h, seq)

    def producer(self, seq: Sequence, num_hit_blocks: int, max_hit_blocks: int) -> Sequence | None:
        """The scheduled sequence computing the first block that waiting seq would
        otherwise compute itself (its block num_hit_blocks), if seq could hit that
        block (below max_hit_blocks, the cap that leaves its last token to compute)."""
        if num_hit_blocks >= min(max_hit_blocks, len(seq.block_hashes)):
            return None
        found = self._producers.get(seq.block_hashes[num_hit_blocks])
        return found if found is not seq else None

    def __len__(self) -> int:
        return len(self._producers)
