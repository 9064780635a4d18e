"""KV cache groups: which layers share a block table, and how much of the context
each group keeps.

A model whose layers all attend to the whole context has one group holding every
layer: one block table per sequence and one page per block, as always. A model with
sliding-window layers (Gemma 3: five of every six) splits its layers into groups of
equal size, each group all-full or all-sliding. Every group's page has the same shape
([group_size layers, block_size tokens, kv_heads, head_dim] for K and for V), so all
pages come from the one pool with no fixed split between the kinds; each group has
its own block table per sequence, and a sliding group returns the pages whose tokens
fell out of its window as the sequence advances (after the model of vLLM's hybrid KV
cache manager).

Full-attention groups come first, so a sequence's `block_table` (group 0) is a
whole-prefix table wherever the model has a full layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.attention import AttentionMetadata

# A block-table entry whose page was released (out of a sliding group's window).
RELEASED = -1


@dataclass(frozen=True)
class KVGroups:
    group_size: int  # layers per page
    layers: tuple[tuple[int, ...], ...]  # each group's layers, in order
    windows: tuple[int | None, ...]  # each group's window; None: full attention
    num_layers: int

    @property
    def hybrid(self) -> bool:
        return len(self.layers) > 1

    @property
    def num_groups(self) -> int:
        return len(self.layers)

    @property
    def sliding(self) -> list[int]:
        return [g for g, w in enumerate(self.windows) if w is not None]

    @property
    def full(self) -> list[int]:
        return [g for g, w in enumerate(self.windows) if w is None]

    def place(self, layer: int) -> tuple[int, int]:
        """(group, slot in the group's page) of a layer."""
        for g, members in enumerate(self.layers):
            if layer in members:
                return g, members.index(layer)
        raise KeyError(layer)

    def pages_per_whole_block(self) -> int:
        """How many pages hold the bytes of one block of every layer: the pool's
        size in pages for a budget given in whole-KV blocks."""
        return max(1, self.num_layers // self.group_size)

    def first_needed_block(self, group: int, position: int, block_size: int) -> int:
        """The first block a query at `position` reads in `group`: 0 in a full group,
        the block holding position - window + 1 in a sliding one."""
        window = self.windows[group]
        if window is None:
            return 0
        return max(0, position - window + 1) // block_size

    def max_tokens(self, num_pages: int, block_size: int, chunk: int) -> int:
        """The longest context one sequence can hold in num_pages: the sliding groups
        at most a window plus a chunk each, the full groups the rest."""
        if not self.hybrid:
            return num_pages * block_size
        windowed = sum(-(-(self.windows[g] + chunk) // block_size) + 1 for g in self.sliding)
        full = len(self.full)
        if not full:
            return 1 << 30 if num_pages >= windowed else 0
        return max(0, num_pages - windowed) // full * block_size


def held_pages(groups: KVGroups, context_len: int, block_size: int) -> int:
    """Pages one sequence holds at a decode step over context_len tokens: every block
    in a full group, the blocks its next query's window reaches in a sliding one."""
    blocks = -(-context_len // block_size)
    return sum(blocks - groups.first_needed_block(g, context_len - 1, block_size)
               for g in range(groups.num_groups))


def whole(num_layers: int) -> KVGroups:
    """One group holding every layer, each keeping the whole context."""
    return KVGroups(num_layers, (tuple(range(num_layers)),), (None,), num_layers)


def kv_groups(windows: list[int | None], enabled: bool = True) -> KVGroups:
    """The groups for layers with these windows (None: full attention). Without a
    sliding layer, or when not enabled, one group of every layer. Otherwise the group
    size is the smallest count of layers of one kind (Gemma 3 270M: 3 full and 15
    sliding layers give groups of 3); a kind's last group may be short, its spare
    slot unused."""
    n = len(windows)
    kinds: dict[int | None, list[int]] = {}
    for i, w in enumerate(windows):
        kinds.setdefault(w, []).append(i)
    if not enabled or set(kinds) == {None}:
        return whole(n)
    size = min(len(members) for members in kinds.values())
    layers, group_windows = [], []
    # Full groups first (block_table stays a whole-prefix table), then by window.
    for w in sorted(kinds, key=lambda w: (w is not None, w or 0)):
        members = kinds[w]
        for at in range(0, len(members), size):
            layers.append(tuple(members[at : at + size]))
            group_windows.append(w)
    return KVGroups(size, tuple(layers), tuple(group_windows), n)


def model_windows(model) -> list[int | None]:
    """Each decoder layer's sliding window (None: full attention)."""
    return [getattr(getattr(layer, "self_attn", None), "window", None) for layer in model.layers]


@dataclass
class GroupedMetadata:
    """One step's attention metadata per KV group, and where each layer reads:
    layer i uses groups[group_of[i]] and slot slot_of[i] of the cache."""

    groups: list[AttentionMetadata]
    group_of: list[int]
    slot_of: list[int]

    def layer(self, i: int) -> tuple[int, AttentionMetadata]:
        return self.slot_of[i], self.groups[self.group_of[i]]
