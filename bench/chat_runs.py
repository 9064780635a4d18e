"""Chat workloads run in-process (multiturn, offload): each turn's prompt as token ids,
the engine's outputs noted in RequestRecords, and a run's figures."""

from __future__ import annotations

from bench import conversations as wl
from bench.metrics import RequestRecord, by_turn, cacheable_from, later_turns, stats, summarize
from bench.workloads import chat_prompt_ids, next_turn_ids


class ChatPrompts:
    """Turn prompts as token ids: built from the replies in the live run, then replayed."""

    def __init__(self, tokenizer, workload: wl.Workload):
        self.tok = tokenizer
        self.workload = workload
        self.recorded: dict[tuple[int, int], list[int]] = {}
        self.replies: dict[tuple[int, int], list[int]] = {}

    def messages(self, conv: int, turn: int) -> list[dict]:
        """The messages of (conv, turn) as text, with the replies of the turns before it."""
        c = self.workload.conversations[conv]
        replies = [self.tok.decode(self.replies[(conv, k)]) for k in range(1, turn)]
        return c.messages(replies)

    def build(self, conv: int, turn: int, prev: tuple[list[int], list[int]] | None) -> list[int]:
        """Prompt of (conv, turn): prev is (previous prompt, its reply ids)."""
        if prev is None:
            ids = chat_prompt_ids(self.tok, self.messages(conv, 1))
        else:
            ids = next_turn_ids(
                self.tok,
                self.messages(conv, turn - 1),
                prev[0],
                prev[1],
                self.workload.conversations[conv].turns[turn - 1].user,
            )
        self.recorded[(conv, turn)] = ids
        return ids

    def replay(self, conv: int, turn: int, prev) -> list[int]:
        return self.recorded[(conv, turn)]

    def history(self, conv: int, turn: int) -> list[int]:
        """What the engine computed for (conv, turn): its prompt and reply, less the last token."""
        return [*self.recorded[(conv, turn)], *self.replies.get((conv, turn), [])[:-1]]


def note_output(rec: RequestRecord, out, now: float) -> bool:
    """Fill rec in from one engine output that arrived at `now`; True once it finished."""
    if out.new_token_ids:
        if rec.first_token is None:
            rec.first_token = now
        rec.chunk_times.append(now)
    if not out.finished:
        return False
    rec.end, rec.completion_tokens = now, len(out.token_ids)
    rec.cached_tokens = out.cached_tokens
    if out.finish_reason not in ("stop", "length"):
        rec.error = out.error or out.finish_reason
    return True


def system_result(
    records: list[RequestRecord],
    seconds: float,
    prompts: ChatPrompts,
    warm: list[int],
    block_size: int,
    note: str,
) -> dict:
    """One system's JSON: each record's exact ceiling of cached tokens (what the warm-up
    and the conversation's previous turn computed), the run's summary, turns >= 2, by
    turn, and every request."""
    for r in records:
        earlier = [warm] + ([prompts.history(r.conversation, r.turn - 1)] if r.turn > 1 else [])
        r.max_cached_tokens = cacheable_from(
            prompts.recorded[(r.conversation, r.turn)], earlier, block_size
        )
    later = later_turns(records)
    return {
        "note": note,
        "summary": summarize(records, seconds),
        "turns_2_plus": {
            "ttft_s": stats(r.ttft for r in later if r.ok),
            **{
                k: v
                for k, v in summarize(later, seconds).items()
                if k.startswith(("cached", "max_cached", "prompt"))
            },
        },
        "by_turn": by_turn(records),
        "requests": [r.as_dict() for r in records],
    }
