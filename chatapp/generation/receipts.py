"""A reply's cache receipt (its reasons: docs/chat.md, "Cache receipts"): the engine's
record of where the prompt's prefix-cache match ended, plus what only the chat knows, the
previous turn. A prompt that does not extend the previous turn's prompt and reply (an
edit, a regenerated earlier turn) "diverged" where they differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.chat import selectors
from chatapp.chat.models import Message

SEGMENTS = {"system": "system prompt", "history": "earlier message", "user": "new message",
            "generation_prompt": "reply header"}


@dataclass(frozen=True)
class Divergence:
    index: int  # the first prompt token that differs from the previous turn's
    message_id: int | None  # the message whose segment holds it (None: the system prompt)
    segment: str


def divergence(*, reply: Message, plan, path: list[Message]) -> Divergence | None:
    """Where this reply's prompt (`plan`, built from `path`: root .. the user message)
    first differs from the ids the conversation's previous reply left in the cache."""
    finished = Message.objects.filter(
        conversation_id=reply.conversation_id, role=Message.Role.ASSISTANT, pk__lt=reply.pk,
        prompt_tokens__isnull=False,
    ).order_by("-pk")[:8]
    # The latest reply that left ids (a failed one left none).
    previous = next((m for m in finished if m.token_ids), None)
    if previous is None:
        return None
    system = next((seg for seg in plan.segments if seg.kind == "system"), None)
    before = list(plan.token_ids[: system.end]) if system is not None else []
    for message in selectors.message_path(message=previous):
        before.extend(message.token_ids)
    pairs = zip(plan.token_ids, before, strict=False)
    at = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
    if at is None:
        return None
    # History segments follow the path's messages in order; the new message is last.
    owners = iter(path)
    for seg in plan.segments:
        owner = next(owners) if seg.kind in ("history", "user") else None
        if seg.start <= at < seg.end:
            return Divergence(at, owner.pk if owner is not None else None,
                              SEGMENTS.get(seg.kind, seg.kind))
    return Divergence(at, None, "prompt")


def shown_reason(reason: str, matched_tokens: int) -> str:
    """The engine calls a match that reused all it had computed and then met new tokens
    "cold"; for people that is "full": everything cacheable was reused."""
    return "full" if reason == "cold" and matched_tokens > 0 else reason


def receipt(record, diverged: Divergence | None, block_size: int) -> dict | None:
    """The receipt stored with a reply, from the engine's record (None: not admitted)."""
    if record is None:
        return None
    out = {"reason": record.reason, "matched_tokens": record.matched_tokens,
           "tier_tokens": record.tier_tokens, "evicted_from": record.evicted_from}
    if record.reason == "full":
        return out
    if diverged is not None and record.matched_tokens >= diverged.index // block_size * block_size:
        out.update(reason="diverged", evicted_from=None, diverged_at=diverged.index,
                   diverged_message_id=diverged.message_id, diverged_segment=diverged.segment)
    else:
        out["reason"] = shown_reason(record.reason, record.matched_tokens)
    return out
