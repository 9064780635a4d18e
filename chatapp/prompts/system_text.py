"""A user's own system prompt: the rules its text obeys before it becomes a system segment.

The text is never rendered as a template: whatever Jinja it holds stays as written, so
it cannot reach a clock or a random value, and the same text always gives the same
block-padded segment (PromptBuilder.system_segment_for_text), which every chat on it
shares. What the linter refuses in a preset is refused here too, where the text asks for
it: a placeholder naming a clock, a random value or the request ("{{ now() }}",
Open WebUI's "{{CURRENT_DATE}}") would be sent as written, never filled in, so a user
expecting today's date would be misled; better to say so at once.
"""

from __future__ import annotations

import re

from chatapp.prompts.encoding import check_text
from chatapp.prompts.errors import MessageTooLong, PromptError
from chatapp.prompts.presets import setting
from chatapp.prompts.templating import unstable_category

DEFAULT_MAX_CHARS = 8000

# "{{ ... }}" (Jinja, Open WebUI, Mustache) and "{% ... %}": where a placeholder would be.
_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.DOTALL)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnstableText(PromptError):
    """A system prompt that asks for a clock, random or per-request value."""


def max_chars() -> int:
    return int(setting("CHAT_SYSTEM_PROMPT_MAX_CHARS", DEFAULT_MAX_CHARS))


def check_system_text(text: object) -> str:
    """`text`, stripped, as a chat's own system prompt ("" means the preset's); a
    PromptError with a message fit to show otherwise."""
    if not isinstance(text, str):
        raise PromptError("the system prompt must be text")
    text = text.strip()
    limit = max_chars()
    if len(text) > limit:
        raise MessageTooLong(f"the system prompt has {len(text)} characters; the limit is {limit}")
    check_text(text, "the system prompt")
    for match in _PLACEHOLDER.finditer(text):
        inner = match.group(1) if match.group(1) is not None else match.group(2)
        for name in _NAME.findall(inner):
            category = unstable_category(name)
            if category is not None:
                raise UnstableText(
                    f"the system prompt asks for {match.group(0).strip()!s}, a {category} value: "
                    "system prompts are sent as written (never filled in), so that every "
                    "chat on them shares their cached blocks; write the text itself instead"
                )
    return text
