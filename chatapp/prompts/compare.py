"""Comparing token sequences: where two prompts stop sharing a prefix."""

from __future__ import annotations

from collections.abc import Sequence


def first_divergence(a: Sequence, b: Sequence) -> int | None:
    """Index of the first differing element; the shorter length when one is a prefix of
    the other; None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def piece(tokenizer, ids: Sequence[int], i: int | None) -> str:
    """Token i as "'text' (id N)", for messages."""
    if i is None or i >= len(ids):
        return "(end)"
    return f"{tokenizer.decode([ids[i]])!r} (id {ids[i]})"


def describe_divergence(tokenizer, a: Sequence[int], b: Sequence[int], labels=("A", "B")) -> str:
    i = first_divergence(a, b)
    return (
        f"first divergence at token {i}: {labels[0]} has {piece(tokenizer, a, i)}, "
        f"{labels[1]} has {piece(tokenizer, b, i)}"
    )
