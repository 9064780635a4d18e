"""The sampling a chat reply gets: the chat's own settings (chatapp.chat.chat_settings),
else the server's CHAT_TEMPERATURE, CHAT_TOP_P and CHAT_MAX_NEW_TOKENS. One place for
replies generated here and on a worker, which run the same code."""

from __future__ import annotations

from django.conf import settings

from chatapp.generation.jobs import Options


def reply_max_new_tokens(conversation) -> int:
    """The reply's budget: the chat's reply length (validated to at most
    CHAT_MAX_NEW_TOKENS), else CHAT_MAX_NEW_TOKENS."""
    own = conversation.max_new_tokens
    return min(own, settings.CHAT_MAX_NEW_TOKENS) if own else settings.CHAT_MAX_NEW_TOKENS


def reply_options(conversation) -> Options:
    temperature = conversation.temperature
    top_p = conversation.top_p
    return Options(
        default_max_tokens=reply_max_new_tokens(conversation),
        temperature=settings.CHAT_TEMPERATURE if temperature is None else temperature,
        top_p=settings.CHAT_TOP_P if top_p is None else top_p,
    )
