"""A chat reply's prompt, from the conversation's stored segments (chatapp.prompts).

The prompt holds no limit of its own: how many tokens the reply may take, and
whether the prompt fits at all, is decided against the engine that runs it
(chatapp.generation.jobs and the engine's add_request).
"""

from __future__ import annotations

import logging

from chatapp.chat import selectors
from chatapp.chat.errors import sentence
from chatapp.prompts.errors import PromptError
from chatapp.prompts.profile import record_prompt
from chatapp.prompts.services import PromptBuilder, PromptPlan, builder_for, cache_salt_for

log = logging.getLogger(__name__)


class PromptFailure(Exception):
    """The prompt cannot be built (unknown preset, a stored message without ids, ...)."""


def _system_ids(builder: PromptBuilder, conversation) -> list[int]:
    return builder.system_segment(conversation.preset_id, conversation.preset_version or None,
                                  conversation.preset_variables or None)


def build_reply_prompt(*, tokenizer, conversation, history: list) -> PromptPlan:
    """The prompt for a reply to history[-1] (a user message), from stored segments.

    `history` is the branch from the root to the user message; every earlier message
    contributes exactly its stored token ids, so this prompt extends the last one.
    """
    builder = builder_for(tokenizer)
    try:
        plan = builder.build(
            _system_ids(builder, conversation),
            [list(m.token_ids) for m in history[:-1]],
            history[-1].content,
            preset_id=conversation.preset_id,
            preset_version=conversation.preset_version or None,
            cache_salt=cache_salt_for(conversation.owner),
        )
    except PromptError as exc:
        raise PromptFailure(sentence(str(exc), "The prompt failed.")) from exc
    try:
        record_prompt(plan, label=f"chat c{conversation.pk} u{history[-1].pk}")
    except Exception:  # the profile is a diagnostic; a reply never fails for it
        log.debug("record_prompt failed", exc_info=True)
    return plan


def conversation_prompt_ids(*, tokenizer, conversation) -> list[int]:
    """The ids the conversation's next turn starts with: its system segment, then the
    stored segments of its current branch up to the first message without ids."""
    try:
        ids = _system_ids(builder_for(tokenizer), conversation)
    except PromptError:
        return []
    for message in selectors.current_branch(conversation=conversation):
        if not message.token_ids:
            break
        ids.extend(message.token_ids)
    return ids
