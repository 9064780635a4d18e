"""Errors of the prompt manager. All are ValueErrors: they describe bad input, not bugs."""

from __future__ import annotations


class PromptError(ValueError):
    """Base class: the prompt cannot be built; the message is safe to show to the user."""


class EmptyMessage(PromptError):
    pass


class MessageTooLong(PromptError):
    pass


class InvalidText(PromptError):
    """Text no tokenizer should see: a lone UTF-16 surrogate or a NUL character."""


class ContextLengthExceeded(PromptError):
    def __init__(self, prompt_tokens: int, max_new_tokens: int, max_model_len: int):
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"this conversation needs {prompt_tokens} prompt tokens + {max_new_tokens} new "
            f"tokens, over the model's context of {max_model_len} tokens; start a new "
            "conversation or shorten the message (history is never truncated silently)"
        )


class PresetError(PromptError):
    pass


class PresetNotFound(PresetError):
    pass


class PresetInvalid(PresetError):
    """The preset fails validation (syntax, unknown variable, sandbox) and cannot be used."""


class PresetRenderError(PresetError):
    pass


class FormatError(PromptError):
    """A chat format is missing, malformed, or unusable with this tokenizer."""


class InvalidMessages(PromptError):
    """A stateless (OpenAI-style) message list the builder cannot render."""
