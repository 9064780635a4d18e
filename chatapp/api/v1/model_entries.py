"""/v1/models' entries, and the refusal of a model on an endpoint of the other kind
(a base model on /v1/chat/completions: chatapp.generation.model_cards)."""

from __future__ import annotations

from chatapp.api.errors import invalid
from chatapp.echo import quoted
from chatapp.generation import model_cards, served_models


def entry(name: str) -> dict:
    """The /v1/models entry of the served model `name` reaches (under that name): OpenAI's
    fields, then its own name, every name it answers to, its kind, its context
    (`context_length`, and `max_model_len` as vLLM says it), weight dtype and kernel path."""
    card = model_cards.card(name)
    return {
        "id": name, "object": "model", "created": card["created"], "owned_by": "prefixchat",
        "root": card["model"], "aliases": card["aliases"], "kind": card["kind"],
        "context_length": card["context_length"], "max_model_len": card["context_length"],
        "weight_dtype": card["weight_dtype"], "kernel_path": card["kernel_path"],
    }


def listing() -> dict:
    return {"object": "list", "data": [entry(name) for name in served_models.names_listed()]}


def require_chat_model(name: str) -> None:
    """400 for a completion (base) model on the chat endpoint, saying why."""
    if model_cards.kind(name) == model_cards.COMPLETION:
        raise invalid(
            f"The model {quoted(name)} is a base model (its file has no chat template), so "
            "it is served for text completions only: use /v1/completions.",
            "model", "model_not_chat")
