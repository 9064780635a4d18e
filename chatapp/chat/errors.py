"""Errors a user can cause. Each carries a stable code for WebSocket error events
and a message fit to show to the person who caused it."""

from __future__ import annotations


class ChatError(Exception):
    code = "bad_request"
    http_status = 400

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class NotFound(ChatError):
    """Also raised for another user's conversation: whether it exists is not revealed."""

    code = "not_found"
    http_status = 404


class InvalidInput(ChatError):
    code = "invalid"


class Busy(ChatError):
    code = "busy"
    http_status = 409


def sentence(text: str, empty: str = "Invalid input.") -> str:
    """An error's text as a sentence fit to show: capitalised, one full stop."""
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else empty
