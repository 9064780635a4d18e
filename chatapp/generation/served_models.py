"""The models this installation serves, by the names clients and the chat page use.

`LLM_MODELS` lists them as `alias=model[:weight_dtype]`, comma-separated; the first is the
default (conversations without a model of their own, /v1 requests naming an extra alias of
API_MODEL_ALIASES). Unset, the one model is LLM_MODEL, under its own name, with
LLM_WEIGHT_DTYPE: the service as it was before several models. Each model gets its own
engine, so its own KV pool and prefix cache (docs/configuration.md, "Several models").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from django.conf import settings

from chatapp.chat.errors import InvalidInput

# An alias goes into engine ids, Prometheus labels and URLs: a plain name.
ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
WEIGHT_DTYPES = ("auto", "bf16", "fp32", "int8", "int4")


class UnknownModel(Exception):
    """A model name this installation does not serve."""

    def __init__(self, name: str):
        self.name = name
        names = ", ".join(names_listed())
        super().__init__(f"The model {name!r} is not served here. Available: {names}.")


@dataclass(frozen=True)
class ModelSpec:
    alias: str  # the name clients use (/v1 `model`, the chat page's picker)
    model: str  # what the engine loads: a known name, a folder or a GGUF file
    weight_dtype: str | None = None  # None: LLM_WEIGHT_DTYPE


def parse_models(text: str) -> list[ModelSpec]:
    """`alias=model[:weight_dtype],...` as ModelSpecs; ValueError naming what is wrong. A
    `:suffix` is a weight dtype only when it is one (a path may hold a colon)."""
    specs: list[ModelSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        alias, sep, model = (s.strip() for s in item.partition("="))
        if not sep or not model:
            raise ValueError(f"LLM_MODELS: {item!r} is not alias=model[:weight_dtype].")
        if not ALIAS.match(alias):
            raise ValueError(f"LLM_MODELS: the alias {alias!r} must be letters, digits, '.', "
                             "'_' or '-' (at most 64).")
        if any(s.alias == alias for s in specs):
            raise ValueError(f"LLM_MODELS: the alias {alias!r} is given twice.")
        weight_dtype = None
        head, colon, tail = model.rpartition(":")
        if colon and head and tail in WEIGHT_DTYPES:
            model, weight_dtype = head, tail
        specs.append(ModelSpec(alias, model, weight_dtype))
    return specs


def specs() -> list[ModelSpec]:
    """Every served model, the default first."""
    if settings.LLM_MODELS:
        return parse_models(settings.LLM_MODELS)
    return [ModelSpec(settings.LLM_MODEL, settings.LLM_MODEL)]


def check() -> None:
    """ImproperlyConfigured, naming the mistake, when LLM_MODELS cannot be read: a serving
    process stops at start rather than failing its first request."""
    from django.core.exceptions import ImproperlyConfigured

    try:
        specs()
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def several() -> bool:
    """LLM_MODELS is set: engines are named per model (engine_id_for)."""
    return bool(settings.LLM_MODELS)


def default_alias() -> str:
    return specs()[0].alias


def aliases() -> list[str]:
    return [s.alias for s in specs()]


def names_listed() -> list[str]:
    """What /v1/models lists: every model, then the default's extra names."""
    listed = aliases()
    return listed + [a for a in settings.API_MODEL_ALIASES if a not in listed]


def model_id(spec: ModelSpec) -> str:
    """The model's own name, beside its alias: a known name as it is, a .gguf file's or
    a folder's name for a path."""
    path = PurePath(spec.model)
    if path.suffix == ".gguf":
        return path.stem
    return path.name if len(path.parts) > 1 else spec.model


def names_of(spec: ModelSpec) -> list[str]:
    """Every name that reaches `spec`: its alias, its own name (the first model of that
    name takes it), and for the default the extra names of API_MODEL_ALIASES."""
    all_specs = specs()
    names = [spec.alias]
    own = model_id(spec)
    if own not in names and resolve(own) == spec:
        names.append(own)
    if spec == all_specs[0]:
        names += [a for a in settings.API_MODEL_ALIASES if a not in names]
    return names


def resolve(name: str | None) -> ModelSpec:
    """The model `name` denotes: an alias, an extra name of the default, a model's own
    name (the first model of that name, when two aliases serve one model), or "" / None
    (the default: conversations from before several models). UnknownModel otherwise."""
    all_specs = specs()
    if not name or name in settings.API_MODEL_ALIASES:
        return all_specs[0]
    for spec in all_specs:
        if spec.alias == name:
            return spec
    for spec in all_specs:
        if model_id(spec) == name:
            return spec
    raise UnknownModel(name)


def conversation_value(name: str | None) -> str:
    """What a new conversation stores for the model `name` picks (UnknownModel if none):
    the alias under LLM_MODELS; blank for the one model of LLM_MODEL, so that changing
    LLM_MODEL later leaves conversations answerable."""
    spec = resolve(name)
    return spec.alias if several() else ""


def conversation_model(name: object) -> str:
    """conversation_value() for a name a user sent: InvalidInput (a 400 with the names
    served) for one not served or not text."""
    if name is not None and not isinstance(name, str):
        raise InvalidInput("The model must be a name (text).", code="invalid")
    try:
        return conversation_value(name)
    except UnknownModel as exc:
        raise InvalidInput(str(exc), code="unknown_model") from None


def alias_of(stored: str) -> str:
    """The alias a conversation's stored model names (blank: the default's)."""
    return stored or default_alias()


def engine_id_for(alias: str) -> str:
    """The engine id of `alias`'s engine in this process: the process's own name
    (LLM_ENGINE_ID, a worker's hostname), suffixed with the alias when LLM_MODELS is set."""
    base = settings.LLM_ENGINE_ID
    return f"{base}:{alias}" if several() else base


def share(total: int | None, n: int) -> int | None:
    """A per-process budget split evenly between `n` models (None stays None)."""
    if not total:
        return total
    return max(1, total // max(1, n))
