"""Summaries of the turns a history cut leaves out (CHAT_HISTORY_SUMMARY, off by default).

What the prompt manager owns of them: whether they are on, the room a cut holds for one
(CHAT_HISTORY_SUMMARY_TOKENS, whole blocks), the request that asks the model for one
(`templates/prompts/instructions/summarise_history.jinja`), and the segment a summary
becomes after the marker (`templates/prompts/markers/history_summary.jinja`), cut to
that room. Asking, storing and dispatching belong to the chat service
(chatapp.generation.summaries).
"""

from __future__ import annotations

from chatapp.prompts.history import summary_marker_text
from chatapp.prompts.instructions import instruction_path, render_instruction
from chatapp.prompts.presets import setting
from chatapp.prompts.services import PromptBuilder

DEFAULT_SUMMARY_TOKENS = 256
REQUEST = "summarise_history"
# About how many words the model writes per token of English text.
WORDS_PER_TOKEN = 0.6


def summaries_enabled() -> bool:
    """settings.CHAT_HISTORY_SUMMARY: a cut asks the model for a summary of what it left out."""
    return bool(setting("CHAT_HISTORY_SUMMARY", False))


def summary_room(block_size: int) -> int:
    """The tokens a cut holds after the marker for a summary: CHAT_HISTORY_SUMMARY_TOKENS
    rounded up to whole blocks when summaries are on, else 0."""
    if not summaries_enabled():
        return 0
    tokens = max(0, int(setting("CHAT_HISTORY_SUMMARY_TOKENS", DEFAULT_SUMMARY_TOKENS)))
    return -(-tokens // block_size) * block_size


def request_path():
    return instruction_path(REQUEST)


def request_text(max_words: int, source: str | None = None) -> str:
    """The user turn that asks for the summary, sent after the turns left out."""
    return render_instruction(REQUEST, source, max_words=int(max_words))


def max_summary_tokens(builder: PromptBuilder, room: int) -> int:
    """How many tokens the model may write for a summary that must fit `room`: the room
    less what the segment takes around an empty summary (padding aside)."""
    parts = builder.chat_format.turn_parts("system", summary_marker_text(""))
    return max(0, room - len(builder.encoder.parts(*parts)))


def max_summary_words(tokens: int) -> int:
    return max(1, int(tokens * WORDS_PER_TOKEN))


def summary_segment(builder: PromptBuilder, text: str, room: int) -> list[int] | None:
    """The stored segment of a summary the model wrote (`text`): the summary marker
    rendered around it, encoded and padded to whole blocks, its end cut (at a word where
    it has one) until it fits `room`; None when it is blank or nothing of it fits."""
    # A NUL or a lone surrogate (random ids can decode to them) is no text to keep.
    text = text.replace("\x00", "").encode("utf-8", "ignore").decode("utf-8").strip()
    if not text:
        return None
    whole = builder.summary_segment(summary_marker_text(text))
    if len(whole) <= room:
        return whole
    ids = builder.encoder.untrusted(text)

    def head(n: int) -> str:  # its first n tokens, without a character cut in half
        return builder.tokenizer.decode(ids[:n]).rstrip("\ufffd").strip()

    def segment(part: str) -> list[int] | None:
        ids = builder.summary_segment(summary_marker_text(part)) if part else None
        return ids if ids is not None and len(ids) <= room else None

    # The most tokens that fit (a segment grows with them), then back to a word's end.
    lo, hi = 1, len(ids) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if segment(head(mid)) is not None:
            lo = mid + 1
        else:
            hi = mid - 1
    part = head(hi) if hi > 0 else ""
    words = part.rsplit(None, 1)
    return (segment(words[0]) if len(words) == 2 else None) or segment(part)
