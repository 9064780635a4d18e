"""What each served model is, for /v1/models, /readyz and the chat page's picker: its
names, its kind, its context, its weight dtype and kernel path, its file's date.

A model whose file carries no chat template is a base model: a *completion* model,
served on /v1/completions only (a chat turn format would be a guess it was never
trained on), unless the operator names it in LLM_FORCE_CHAT_TEMPLATE. Every other model
is a *chat* model, served on both.
"""

from __future__ import annotations

import logging

from django.conf import settings

from chatapp.generation import embedded, prompting, served_models
from chatapp.generation.served_models import ModelSpec

log = logging.getLogger(__name__)

CHAT, COMPLETION = "chat", "completion"


def _forced(spec: ModelSpec) -> bool:
    forced = settings.LLM_FORCE_CHAT_TEMPLATE
    return "*" in forced or spec.alias in forced or served_models.model_id(spec) in forced


def kind(alias: str | None) -> str:
    """CHAT or COMPLETION for the served model `alias` names (UnknownModel otherwise)."""
    spec = served_models.resolve(alias)
    if _forced(spec):
        return CHAT
    embedded.import_engine_package()
    from inference.model_file import has_chat_template

    try:
        return CHAT if has_chat_template(spec.model, settings.LLM_MODEL_CACHE) else COMPLETION
    except (OSError, ValueError):
        # A file not there yet fails when its engine loads, saying why; until then it is
        # taken for what the service always served.
        log.debug("no model file to ask for %s's chat template", spec.alias, exc_info=True)
        return CHAT


def chat_aliases() -> list[str]:
    """The served chat models (the chat page's picker)."""
    return [alias for alias in served_models.aliases() if kind(alias) == CHAT]


def _created(spec: ModelSpec) -> int:
    embedded.import_engine_package()
    from inference.model_file import created

    try:
        return created(spec.model, settings.LLM_MODEL_CACHE)
    except (OSError, ValueError):
        return 0


def card(alias: str) -> dict:
    """The served model `alias` as /v1/models and /readyz describe it. The context, dtypes
    and kernel path are its loaded engine's; before it loads, the configured context (an
    upper bound) and weight dtype, and no kernel path."""
    embedded.import_engine_package()
    spec = served_models.resolve(alias)
    engine = embedded.loaded_engine(spec.alias)
    config = getattr(engine, "config", None) or embedded.engine_config(spec.alias)
    return {
        "model": served_models.model_id(spec),
        "aliases": served_models.names_of(spec),
        "kind": kind(spec.alias),
        "context_length": prompting.context_tokens(spec.alias, chat=False),
        "weight_dtype": config.weight_dtype,
        "dtype": config.dtype,
        "kernel_path": getattr(engine, "cpu_path", None),
        "created": _created(spec),
        "loaded": engine is not None,
    }


def conversation_model(name: object) -> str:
    """served_models.conversation_model() for a chat model: InvalidInput (a 400 saying
    why) for a completion model, which has no turns to hold a conversation in."""
    from chatapp.chat.errors import InvalidInput

    value = served_models.conversation_model(name)
    if kind(value or None) == COMPLETION:
        alias = served_models.resolve(value or None).alias
        raise InvalidInput(f"The model {alias!r} is a base model (its file has no chat "
                           "template): it serves text completions (/v1/completions), not "
                           "conversations.", code="model_not_chat")
    return value
