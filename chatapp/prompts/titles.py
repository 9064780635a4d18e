"""Titles the model writes for a conversation (CHAT_TITLES, on by default).

What the prompt manager owns of them: whether they are on, the request that asks for one
(`templates/prompts/instructions/title_conversation.jinja`, sent after the conversation's
own prompt so the prefix cache serves all but the request) and how the model's text
becomes a title. Asking, storing and dispatching belong to the chat service
(chatapp.generation.titles).
"""

from __future__ import annotations

import re

from chatapp.prompts.instructions import instruction_path, render_instruction
from chatapp.prompts.presets import setting

REQUEST = "title_conversation"
MAX_WORDS = 6
# Room for MAX_WORDS words and some slack; a title cut at its end is still a title.
MAX_TOKENS = 16
_QUOTES = "\"'`“”‘’«»*#"


def titles_enabled() -> bool:
    """settings.CHAT_TITLES: the model titles a conversation after its first reply."""
    return bool(setting("CHAT_TITLES", True))


def request_path():
    return instruction_path(REQUEST)


def request_text(max_words: int = MAX_WORDS) -> str:
    """The user turn that asks for the title, sent after the first reply."""
    return render_instruction(REQUEST, max_words=int(max_words))


def title_from(text: str, max_chars: int, max_words: int = MAX_WORDS + 2) -> str:
    """The title in what the model wrote: its first non-blank line, without quotes, a
    "Title:" label or a closing full stop, whitespace collapsed, at most `max_words` words
    (a small model writes on past the words it was asked for) and `max_chars` characters
    (cut at a word where it can); "" when nothing is left."""
    # A NUL or a lone surrogate (random ids can decode to them) is no text to keep.
    text = text.replace("\x00", "").encode("utf-8", "ignore").decode("utf-8")
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"^\s*title\s*:\s*", "", line, flags=re.IGNORECASE)
    line = " ".join(line.split()[:max_words])
    line = line.strip(_QUOTES + " ").rstrip(".,;:").strip(_QUOTES + " ")
    line = "".join(ch for ch in line if ch.isprintable())
    if len(line) > max_chars:
        cut = line[:max_chars]
        line = cut.rsplit(" ", 1)[0] if " " in cut else cut
    return line.strip()
