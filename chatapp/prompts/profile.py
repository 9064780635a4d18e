"""The prompt profile: recent prompts side by side, grouped by shared prefix.

Two prompts that look the same can still differ in their ids (a hidden token, a reply
re-encoded differently), and the prefix cache misses from that token on: the profile
shows where. Prompts come from an in-process ring buffer the chat service feeds with
record_prompt(plan), or from a JSONL file of id lists.
"""

from __future__ import annotations

import json
import os.path
import threading
import unicodedata
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chatapp.prompts.compare import first_divergence, piece
from chatapp.prompts.services import default_block_size

RING_SIZE = 64
KEEP_TOKENS = 2048  # enough to find where long prompts diverge; bounds memory


@dataclass(frozen=True)
class RecordedPrompt:
    token_ids: tuple[int, ...]  # the first KEEP_TOKENS ids
    total_tokens: int
    label: str = ""
    preset_id: str | None = None
    preset_version: str | None = None
    prefix_hash: str | None = None
    shared_prefix_len: int | None = None


_META = ("preset_id", "preset_version", "prefix_hash", "shared_prefix_len")  # kept from a plan


def as_recorded(item, label: str = "") -> RecordedPrompt:
    """A RecordedPrompt from a PromptPlan, a mapping with token_ids, or a list of ids."""
    if isinstance(item, RecordedPrompt):
        return item
    if isinstance(item, Mapping):
        ids, meta = item.get("token_ids"), item
    elif hasattr(item, "token_ids"):
        ids, meta = item.token_ids, {k: getattr(item, k, None) for k in _META}
    else:
        ids, meta = item, {}
    if not isinstance(ids, Sequence) or isinstance(ids, str | bytes):
        raise ValueError("a prompt must be a list of token ids")
    ids = [int(t) for t in ids]
    return RecordedPrompt(
        token_ids=tuple(ids[:KEEP_TOKENS]),
        total_tokens=len(ids),
        label=str(meta.get("label") or label),
        **{k: meta.get(k) for k in _META},
    )


_ring: deque[RecordedPrompt] = deque(maxlen=RING_SIZE)
_ring_lock = threading.Lock()


def record_prompt(plan, label: str = "") -> None:
    """Remember a prompt for the profile (the chat service calls this for every reply)."""
    entry = as_recorded(plan, label)
    with _ring_lock:
        _ring.append(entry)


def recent_prompts(limit: int | None = None) -> list[RecordedPrompt]:
    """Recently recorded prompts, oldest first (at most RING_SIZE)."""
    with _ring_lock:
        items = list(_ring)
    return items[-limit:] if limit else items


def clear_recent_prompts() -> None:
    with _ring_lock:
        _ring.clear()


def load_prompts_jsonl(path: Path | str) -> list[RecordedPrompt]:
    """One prompt per line: a JSON list of ids, or an object with "token_ids" (and "label")."""
    prompts = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompts.append(as_recorded(json.loads(line), label=f"line {n}"))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: not a prompt ({exc})") from exc
    return prompts


@dataclass
class ProfileGroup:
    members: list[int]  # indexes into ProfileReport.prompts
    shared_tokens: int
    shared_blocks: int


@dataclass
class Divergence:
    a: int
    b: int
    index: int | None  # None: identical
    look_alike: bool
    a_token: str
    b_token: str


@dataclass
class ProfileReport:
    prompts: list[RecordedPrompt]
    width: int
    block_size: int
    pieces: list[list[tuple[int, str]]]  # per prompt: (id, decoded piece) for the first `width` ids
    groups: list[ProfileGroup] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    def rows(self, columns: Sequence[int] | None = None) -> list[dict]:
        """Token index -> the (id, piece) of each prompt in `columns` (default: all), and
        whether they differ there; up to the longest prompt shown."""
        shown = range(len(self.pieces)) if columns is None else columns
        rows = []
        for i in range(self.width):
            cells = [self.pieces[c][i] if i < len(self.pieces[c]) else None for c in shown]
            if all(c is None for c in cells):
                break
            differ = len({c[0] if c else None for c in cells}) > 1
            rows.append({"index": i, "cells": cells, "differ": differ})
        return rows

    def render_text(self, max_columns: int = 6) -> str:
        """The report as text: groups, divergences, then the first tokens side by side."""
        items = self.prompts
        if not items:
            return "No prompts to profile (none recorded in this process; give some with --file)."
        lines = [
            f"{len(items)} prompts, first {self.width} tokens, KV block size {self.block_size}"
        ]
        for n, g in enumerate(self.groups, 1):
            names = ", ".join(f"#{m + 1}" for m in g.members)
            first = items[g.members[0]]
            about = f" preset {first.preset_id}@{first.preset_version}" if first.preset_id else ""
            if len(g.members) > 1:
                lines.append(
                    f"group {n}: {names} share {g.shared_tokens} leading tokens ({g.shared_blocks} blocks){about}"
                )
            else:
                lines.append(f"group {n}: {names} alone ({first.total_tokens} tokens){about}")
        if self.divergences:
            lines.append("divergences:")
        for d in self.divergences:
            alike = " (look alike)" if d.look_alike else ""
            if d.index is None:
                lines.append(f"  #{d.a + 1} vs #{d.b + 1}{alike}: identical")
            else:
                lines.append(
                    f"  #{d.a + 1} vs #{d.b + 1}{alike}: diverge at index {d.index}: "
                    f"#{d.a + 1} has {d.a_token}, #{d.b + 1} has {d.b_token}"
                )
        shown = list(range(len(items)))[-max_columns:]
        size = 22
        lines.append("side by side (id and piece; * marks rows that differ):")
        lines.append(("  idx  " + " | ".join(f"#{i + 1}".ljust(size) for i in shown)).rstrip())
        for row in self.rows(shown):
            mark = "*" if row["differ"] else " "
            cells = " | ".join(_cell(c, size) for c in row["cells"])
            lines.append(f"{mark}{row['index']:4d}  {cells}".rstrip())
        return "\n".join(lines)


def _visible(tokenizer, ids: Sequence[int]) -> str:
    """What a person sees: no special tokens, no zero-width or other format characters."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf")


def profile_prompts(
    prompts: Iterable, *, tokenizer, width: int = 64, block_size: int | None = None
) -> ProfileReport:
    """Compare prompts (RecordedPrompts, PromptPlans or id lists)."""
    if block_size is None:
        block_size = default_block_size()
    items = [as_recorded(p) for p in prompts]
    pieces = [[(t, tokenizer.decode([t])) for t in p.token_ids[:width]] for p in items]
    report = ProfileReport(prompts=items, width=width, block_size=block_size, pieces=pieces)

    # Group by the first KV block: prompts in one group can share cache blocks.
    keyed: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(items):
        ids = p.token_ids  # a tuple already
        key = ids[:block_size] if len(ids) >= block_size else ("short", *ids)
        keyed.setdefault(key, []).append(i)
    for members in keyed.values():
        shared = len(os.path.commonprefix([items[m].token_ids for m in members]))
        report.groups.append(ProfileGroup(members, shared, shared // block_size))

    def divergence(a: int, b: int, look_alike: bool) -> Divergence:
        ia, ib = items[a].token_ids, items[b].token_ids
        idx = first_divergence(ia, ib)
        tokens = ("", "") if idx is None else (piece(tokenizer, ia, idx), piece(tokenizer, ib, idx))
        return Divergence(a, b, idx, look_alike, *tokens)

    visible = [_visible(tokenizer, p.token_ids[:width]) for p in items]

    def alike(a: int, b: int) -> bool:
        va, vb = visible[a], visible[b]
        return bool(va and vb) and (va.startswith(vb) or vb.startswith(va))

    for group in report.groups:
        for m in group.members[1:]:
            report.divergences.append(divergence(group.members[0], m, alike(group.members[0], m)))
    heads = [g.members[0] for g in report.groups]
    for x, a in enumerate(heads):
        for b in heads[x + 1 :]:
            if alike(a, b):
                report.divergences.append(divergence(a, b, True))
    return report


def _cell(token: tuple[int, str] | None, size: int) -> str:
    if token is None:
        return "".ljust(size)
    text = f"{token[0]} {token[1]!r}"
    return (text if len(text) <= size else text[: size - 1] + "…").ljust(size)
