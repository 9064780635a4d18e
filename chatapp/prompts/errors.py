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
    """A stateless (OpenAI-style) message list the builder cannot render; `param` names
    the field at fault (messages[2].content), `code` how it is wrong (OpenAI's codes)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.code = code
