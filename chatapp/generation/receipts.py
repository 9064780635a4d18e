"""A reply's cache receipt (its reasons: docs/chat.md, "Cache receipts"): the engine's
record of where the prompt's prefix-cache match ended, plus what only the chat knows, the
previous turn. A prompt that does not extend the previous turn's prompt and reply (an
edit, a regenerated earlier turn) "diverged" where they differ; one built after the
chat's system prompt or model changed names that change (`changed`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chatapp.chat import selectors
from chatapp.chat.models import Message
from chatapp.generation.served_models import alias_of
from chatapp.prompts.services import prefix_hash

SEGMENTS = {"system": "system prompt", "cut": "history cut", "summary": "history summary",
            "history": "earlier message", "user": "new message",
            "generation_prompt": "reply header"}


@dataclass(frozen=True)
class Divergence:
    """Where a prompt first differs from the previous turn's (index None: nowhere) and,
    when its oldest turns were left out, what was (history_cut())."""

    index: int | None  # the first prompt token that differs from the previous turn's
    message_id: int | None  # the message whose segment holds it (None: the system prompt)
    segment: str | None
    cut: dict | None = None
    # The chat's settings changed since its previous reply ("system prompt", "model"):
    # this prompt was built anew from there, so the cache was cold because of it.
    changed: tuple[str, ...] = ()


def divergence(*, reply: Message, plan, path: list[Message]) -> Divergence | None:
    """Where this reply's prompt (`plan`, built from `path`: root .. the user message)
    first differs from the ids the conversation's previous reply left in the cache, with
    the history cut it made; None when it extends them and cut nothing."""
    cut = history_cut(plan=plan, path=path)
    changed = _changed_settings(reply, plan)
    if changed:
        return Divergence(None, None, None, cut, changed)
    found = _first_difference(reply, plan, path)
    if found is None:
        return None if cut is None else Divergence(None, None, None, cut)
    return replace(found, cut=cut)


def _previous_reply(reply: Message) -> Message | None:
    """The conversation's latest reply before `reply` that left ids (a failed one left
    none): what its prompt is compared with."""
    finished = Message.objects.filter(
        conversation_id=reply.conversation_id, role=Message.Role.ASSISTANT, pk__lt=reply.pk,
        prompt_tokens__isnull=False,
    ).order_by("-pk")[:8]
    return next((m for m in finished if m.token_ids), None)


def system_hash(plan) -> str:
    """A name for the plan's system segment, kept in the receipt: the next reply tells
    from it whether the chat's system prompt changed in between."""
    system = next((seg for seg in plan.segments if seg.kind == "system"), None)
    return prefix_hash(plan.token_ids[: system.end] if system is not None else ())


def _changed_settings(reply: Message, plan) -> tuple[str, ...]:
    """What of the chat's settings changed since its previous reply: its system prompt
    (by the hash that reply's receipt kept) and its model."""
    previous = _previous_reply(reply)
    if previous is None:
        return ()
    changed = []
    kept = (previous.prefix_cache or {}).get("system")
    if kept is not None and kept != system_hash(plan):
        changed.append("system prompt")
    if alias_of(previous.model) != alias_of(reply.model):
        changed.append("model")
    return tuple(changed)


def _first_difference(reply: Message, plan, path: list[Message]) -> Divergence | None:
    previous = _previous_reply(reply)
    if previous is None:
        return None
    system = next((seg for seg in plan.segments if seg.kind == "system"), None)
    marker = next((seg for seg in plan.segments if seg.kind == "cut"), None)
    summary = next((seg for seg in plan.segments if seg.kind == "summary"), None)
    before = list(plan.token_ids[: system.end]) if system is not None else []
    previous_path = selectors.message_path(message=previous)
    if marker is not None and not plan.cut.new:
        # The previous turn kept the same turns behind the same marker, and the same
        # summary after it unless that became ready since (this turn's one miss).
        shown = summary is not None and _showed_summary(previous)
        before = list(plan.token_ids[: (summary if shown else marker).end])
        previous_path = previous_path[plan.cut.messages:]
    for message in previous_path:
        before.extend(message.token_ids)
    pairs = zip(plan.token_ids, before, strict=False)
    at = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
    if at is None:
        return None
    if marker is not None and plan.cut.new and at >= marker.start:
        return Divergence(at, None, SEGMENTS["cut"])  # this turn moved the cut
    # History segments follow the path's messages in order, after those a cut left out;
    # the new message is last.
    owners = iter(path[plan.cut.messages:] if plan.cut is not None else path)
    for seg in plan.segments:
        owner = next(owners) if seg.kind in ("history", "user") else None
        if seg.start <= at < seg.end:
            return Divergence(at, owner.pk if owner is not None else None,
                              SEGMENTS.get(seg.kind, seg.kind))
    return Divergence(at, None, "prompt")


def _showed_summary(reply: Message) -> bool:
    """Whether `reply`'s prompt had a history summary after the marker (its receipt)."""
    cut = (reply.prefix_cache or {}).get("history_cut") or {}
    return bool(cut.get("summary_tokens"))


def history_cut(*, plan, path: list[Message]) -> dict | None:
    """What the receipt says of a prompt whose oldest turns were left out (`plan` built
    from `path`): how many turns, messages and tokens, whether this turn made the cut
    (its one miss), the first message the model still sees (the page's divider), and
    the tokens of the summary shown after the marker (0: the marker alone)."""
    cut = plan.cut
    if cut is None:
        return None
    return {"turns": cut.turns, "messages": cut.messages, "tokens": cut.tokens,
            "new": cut.new, "first_message_id": path[cut.messages].pk,
            "summary_tokens": cut.summary_tokens}


def shown_reason(reason: str, matched_tokens: int) -> str:
    """The engine calls a match that reused all it had computed and then met new tokens
    "cold"; for people that is "full": everything cacheable was reused."""
    return "full" if reason == "cold" and matched_tokens > 0 else reason


def receipt(record, diverged: Divergence | None, block_size: int, plan=None) -> dict | None:
    """The receipt stored with a reply, from the engine's record (None: not admitted), and
    the turns its prompt left out, if any. With the reply's `plan`, it keeps the name of
    its system segment (system_hash)."""
    if record is None:
        return None
    out = {"reason": record.reason, "matched_tokens": record.matched_tokens,
           "tier_tokens": record.tier_tokens, "evicted_from": record.evicted_from}
    if plan is not None:
        out["system"] = system_hash(plan)
    if diverged is not None and diverged.cut is not None:
        out["history_cut"] = diverged.cut
    if diverged is not None and diverged.changed:
        out["changed"] = list(diverged.changed)
        out["reason"] = shown_reason(record.reason, record.matched_tokens)
        return out
    if record.reason == "full":
        return out
    if (diverged is not None and diverged.index is not None
            and record.matched_tokens >= diverged.index // block_size * block_size):
        out.update(reason="diverged", evicted_from=None, diverged_at=diverged.index,
                   diverged_message_id=diverged.message_id, diverged_segment=diverged.segment)
    else:
        out["reason"] = shown_reason(record.reason, record.matched_tokens)
    return out
