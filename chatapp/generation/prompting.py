"""The chat service's one door to the prompt manager (chatapp.prompts).

Everything the chat needs from it passes here: presets for the picker, the
token-level prompt of a reply, the segment a finished reply stores, the tenant's
cache salt.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from django.conf import settings

from chatapp.prompts import presets
from chatapp.prompts.errors import PresetError, PromptError
from chatapp.prompts.profile import record_prompt
from chatapp.prompts.services import PromptBuilder, PromptPlan

log = logging.getLogger(__name__)

DEFAULT_PRESET = "general"


class PromptFailure(Exception):
    """The prompt cannot be built (context too long, unknown preset, ...): shown to the user."""


@dataclass(frozen=True)
class PresetRef:
    id: str
    version: str
    title: str
    description: str = ""


@dataclass
class ReplyPrompt:
    token_ids: list[int]
    user_segment: list[int]
    cache_salt: str
    stop_token_ids: list[int]
    max_new_tokens: int
    builder: PromptBuilder
    plan: PromptPlan


def _ref(preset) -> PresetRef:
    return PresetRef(preset.id, preset.version, preset.title or preset.id, preset.description)


def available_presets() -> list[PresetRef]:
    return [_ref(p) for p in presets.list_presets()]


def default_preset_id() -> str:
    ids = [p.id for p in available_presets()]
    wanted = getattr(settings, "CHAT_DEFAULT_PRESET", DEFAULT_PRESET)
    if wanted in ids or not ids:
        return wanted
    return ids[0]


def resolve_preset(preset_id: str | None, version: str | None = None) -> PresetRef:
    """The preset (its current version unless one is named); PromptFailure if unknown."""
    preset_id = preset_id or default_preset_id()
    if not isinstance(preset_id, str):
        raise PromptFailure("Unknown preset.")
    try:
        return _ref(presets.get_preset(preset_id, version or None))
    except (PresetError, ValueError) as exc:
        raise PromptFailure(f"Unknown preset {preset_id!r}.") from exc


@functools.cache
def _builder(tokenizer) -> PromptBuilder:
    # One per tokenizer: it caches encoded system segments.
    return PromptBuilder(tokenizer, block_size=settings.LLM_BLOCK_SIZE)


def _max_model_len(engine_max: int | None) -> int:
    return int(getattr(settings, "LLM_MAX_MODEL_LEN", None) or engine_max or 8192)


def build_reply_prompt(
    *, tokenizer, conversation, history: list, max_new_tokens: int,
    engine_max_model_len: int | None = None,
) -> ReplyPrompt:
    """The prompt for a reply to history[-1] (a user message), from stored segments.

    `history` is the branch from the root to the user message; every earlier message
    contributes exactly its stored token ids, so this prompt extends the last one.
    When the context cannot hold `max_new_tokens` more, the reply gets what room is left.
    """
    builder = _builder(tokenizer)
    max_len = _max_model_len(engine_max_model_len)
    try:
        system_ids = builder.system_segment(
            conversation.preset_id,
            conversation.preset_version or None,
            conversation.preset_variables or None,
        )
        plan = builder.build(
            system_ids,
            [list(m.token_ids) for m in history[:-1]],
            history[-1].content,
            max_model_len=max_len,
            max_new_tokens=1,
            preset_id=conversation.preset_id,
            preset_version=conversation.preset_version or None,
            cache_salt=builder.cache_salt_for(conversation.owner),
        )
    except PromptError as exc:
        raise PromptFailure(_sentence(str(exc))) from exc
    try:
        record_prompt(plan, label=f"chat c{conversation.pk} u{history[-1].pk}")
    except Exception:  # the profile is a diagnostic; a reply never fails for it
        log.debug("record_prompt failed", exc_info=True)
    stop_ids = set(builder.stop_token_ids)
    if tokenizer.eos_token_id is not None:
        stop_ids.add(int(tokenizer.eos_token_id))
    return ReplyPrompt(
        token_ids=list(plan.token_ids),
        user_segment=list(plan.new_user_segment),
        cache_salt=plan.cache_salt,
        stop_token_ids=sorted(stop_ids),
        max_new_tokens=max(1, min(max_new_tokens, max_len - len(plan.token_ids))),
        builder=builder,
        plan=plan,
    )


def reply_segment(prompt: ReplyPrompt, generated: list[int], *, finished_with_eos: bool) -> list[int]:
    """The ids a finished (or stopped) reply stores for later prompts."""
    return prompt.builder.assistant_segment(list(generated), finished_with_eos)


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else "The prompt failed."
