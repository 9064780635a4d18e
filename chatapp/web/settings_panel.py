"""What the chat page's settings panel and header need: the chat's settings, the user's
personal presets, the server's defaults and bounds. Read-only; the panel writes through
the conversations API (chatapp.api.chat_settings_views)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from chatapp.chat import chat_settings
from chatapp.chat.models import Conversation
from chatapp.generation import served_models
from chatapp.prompts.errors import PromptError
from chatapp.prompts.presets import get_preset
from chatapp.prompts.system_text import max_chars


def preset_label(conversation: Conversation) -> str:
    """What the header calls the chat's system prompt: its personal preset, "own
    prompt" for text written in the panel, else the operator's preset."""
    if conversation.user_preset_id:
        return conversation.user_preset.name
    if conversation.system_prompt:
        return "own prompt"
    return conversation.preset_id


def _preset_text(conversation: Conversation) -> str:
    try:
        preset = get_preset(conversation.preset_id, conversation.preset_version or None)
        return preset.render(conversation.preset_variables or None)
    except PromptError:
        return ""


def panel_data(conversation: Conversation) -> dict:
    """The panel's initial state, as its script reads it."""
    return {
        "conversation_id": conversation.pk,
        "system_prompt": conversation.system_prompt,
        "preset_text": _preset_text(conversation),
        "temperature": conversation.temperature,
        "top_p": conversation.top_p,
        "max_new_tokens": conversation.max_new_tokens,
        "model": served_models.alias_of(conversation.model),
        "preset_label": preset_label(conversation),
        "preset_id": conversation.preset_id,
        "defaults": {"temperature": settings.CHAT_TEMPERATURE, "top_p": settings.CHAT_TOP_P,
                     "max_new_tokens": settings.CHAT_MAX_NEW_TOKENS},
        "locked": chat_settings.presets_locked(),
    }


def page_context(user: AbstractBaseUser, conversation: Conversation | None) -> dict:
    """The chat page's context for the panel, the header's badges and the new-chat
    picker's personal presets (none where presets are locked)."""
    locked = chat_settings.presets_locked()
    context = {
        "user_presets": [] if locked else list(chat_settings.user_preset_list(user=user)),
        "presets_locked": locked,
        "max_new_tokens_limit": settings.CHAT_MAX_NEW_TOKENS,
        "system_prompt_max_chars": max_chars(),
    }
    if conversation is not None:
        context["preset_label"] = preset_label(conversation)
        context["settings_panel"] = panel_data(conversation)
    return context
