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


class ContextExceeded(PromptError):
    """The newest turn alone (system segment, marker, the new message and the reply's
    header) leaves no room for a reply, however much history is left out."""

    def __init__(self, prompt_tokens: int, max_model_len: int):
        super().__init__(
            f"the message needs {prompt_tokens} prompt tokens even with every earlier turn "
            f"left out, and the model's context holds {max_model_len} (prompt and reply); "
            "shorten the message"
        )
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len
