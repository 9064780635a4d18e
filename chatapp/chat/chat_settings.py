"""A chat's own settings (system prompt, temperature, top_p, reply length, model) and the
personal presets that save them: validation and writes. The chat page's settings panel
and the conversations API both come here.

A setting changed mid-chat applies from the next turn: nothing stored is rewritten, the
next prompt is built with the new system segment (or the new model's tokenizer), and its
receipt says the cache was cold because of the change (chatapp.generation.receipts).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from chatapp.chat.errors import InvalidInput, NotFound, sentence
from chatapp.chat.models import Conversation, UserPreset
from chatapp.prompts.errors import PromptError
from chatapp.prompts.system_text import check_system_text

TEMPERATURE_MAX = 2.0


@dataclass(frozen=True)
class ChatSettings:
    """The settings a panel edits and a personal preset saves (None: the server's)."""

    system_prompt: str = ""
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    model: str = ""


SETTING_NAMES = tuple(f.name for f in fields(ChatSettings))


def presets_locked() -> bool:
    """CHAT_LOCK_PRESETS: users may choose only the operator's presets."""
    return bool(settings.CHAT_LOCK_PRESETS)


def _locked_error() -> InvalidInput:
    return InvalidInput("This server lets you choose only its own presets: system prompts "
                        "of your own are switched off.", code="presets_locked")


# -- validation --------------------------------------------------------------------


def validate_system_prompt(text: object) -> str:
    try:
        text = check_system_text(text if text is not None else "")
    except PromptError as exc:
        raise InvalidInput(sentence(str(exc)), code="invalid_system_prompt") from None
    if text and presets_locked():
        raise _locked_error()
    return text


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{name} must be a number.", code="invalid")
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidInput(f"{name} must be a finite number.", code="invalid")
    return float(value)


def validate_temperature(value: object) -> float | None:
    if value is None:
        return None
    value = _number(value, "Temperature")
    if not 0.0 <= value <= TEMPERATURE_MAX:
        raise InvalidInput(f"Temperature must be between 0 and {TEMPERATURE_MAX:g}.",
                           code="out_of_range")
    return value


def validate_top_p(value: object) -> float | None:
    if value is None:
        return None
    value = _number(value, "top_p")
    if not 0.0 < value <= 1.0:
        raise InvalidInput("top_p must be more than 0 and at most 1.", code="out_of_range")
    return value


def validate_max_new_tokens(value: object) -> int | None:
    """At most CHAT_MAX_NEW_TOKENS: the server's bound on how long a reply holds a slot."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput("Reply length must be a whole number of tokens.", code="invalid")
    limit = settings.CHAT_MAX_NEW_TOKENS
    if not 1 <= value <= limit:
        raise InvalidInput(f"Reply length must be between 1 and {limit} tokens.",
                           code="out_of_range")
    return value


def validate_model(value: object) -> str:
    """The value a conversation stores for its model: what the model catalog gave the
    caller (chatapp.generation.model_cards.conversation_model, as for
    services.conversation_create); None: the default."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput("The model must be a name (text).", code="invalid")
    return value


_VALIDATORS = {"system_prompt": validate_system_prompt, "temperature": validate_temperature,
               "top_p": validate_top_p, "max_new_tokens": validate_max_new_tokens,
               "model": validate_model}


def validate_settings(changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` (some of SETTING_NAMES) checked and normalised; InvalidInput naming the
    first one at fault."""
    unknown = sorted(set(changes) - set(SETTING_NAMES))
    if unknown:
        raise InvalidInput(f"Unknown setting {unknown[0]!r}.", code="invalid")
    return {name: _VALIDATORS[name](value) for name, value in changes.items()}


def settings_of(obj: Conversation | UserPreset) -> ChatSettings:
    return ChatSettings(**{name: getattr(obj, name) for name in SETTING_NAMES})


# -- conversations -----------------------------------------------------------------


def conversation_update_settings(
    *, conversation: Conversation, changes: dict[str, Any], user_preset: UserPreset | None = None,
) -> Conversation:
    """Change some of the conversation's settings; they apply from its next turn. Naming
    a personal preset (`user_preset`) copies all its settings, `changes` on top."""
    if user_preset is not None and presets_locked():
        raise _locked_error()
    base = asdict_settings(user_preset) if user_preset is not None else {}
    values = validate_settings({**base, **changes})
    for name, value in values.items():
        setattr(conversation, name, value)
    touched = list(values)
    if user_preset is not None:
        conversation.user_preset = user_preset
        touched.append("user_preset")
    elif "system_prompt" in values:
        # A system prompt written by hand is no longer the preset's.
        conversation.user_preset = None
        touched.append("user_preset")
    conversation.save(update_fields=[*touched, "updated_at"])
    return conversation


def asdict_settings(preset: UserPreset) -> dict[str, Any]:
    return {name: getattr(preset, name) for name in SETTING_NAMES}


@transaction.atomic
def conversation_start(*, owner: AbstractBaseUser, user_preset_id: object = None,
                       changes: dict[str, Any] | None = None, **create: Any) -> Conversation:
    """A new conversation (`create`: chatapp.chat.services.conversation_create's
    arguments), on the owner's personal preset `user_preset_id` (its settings and model)
    where one is named, with `changes` on top (conversations API)."""
    from chatapp.chat import services

    preset = None
    if user_preset_id not in (None, ""):
        preset = user_preset_get(user=owner, preset_id=user_preset_id)
    conversation = services.conversation_create(owner=owner, **create)
    if preset is not None or changes:
        conversation_update_settings(conversation=conversation, changes=dict(changes or {}),
                                     user_preset=preset)
    return conversation


# -- personal presets --------------------------------------------------------------


def user_preset_list(*, user: AbstractBaseUser) -> QuerySet[UserPreset]:
    return UserPreset.objects.filter(owner=user)


def user_preset_get(*, user: AbstractBaseUser, preset_id: object) -> UserPreset:
    """The user's preset, or NotFound: another user's preset looks absent."""
    try:
        pk = int(preset_id)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise NotFound("Preset not found.") from None
    found = UserPreset.objects.filter(owner=user, pk=pk).first() if user.is_authenticated else None
    if found is None:
        raise NotFound("Preset not found.")
    return found


def validate_preset_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("A preset needs a name.", code="blank")
    name = " ".join(name.split())
    if len(name) > UserPreset.NAME_MAX_CHARS:
        raise InvalidInput(f"A preset's name is at most {UserPreset.NAME_MAX_CHARS} characters.",
                           code="max_length")
    return name


def _save(preset: UserPreset, update_fields: list[str] | None = None) -> UserPreset:
    try:
        with transaction.atomic():
            preset.save(update_fields=update_fields)
    except IntegrityError:
        raise InvalidInput(f"You already have a preset named {preset.name!r}.",
                           code="duplicate_name") from None
    return preset


def user_preset_create(*, owner: AbstractBaseUser, name: object,
                       values: dict[str, Any]) -> UserPreset:
    if presets_locked():
        raise _locked_error()
    checked = validate_settings(values)
    return _save(UserPreset(owner=owner, name=validate_preset_name(name), **checked))


def user_preset_update(*, preset: UserPreset, name: object = None,
                       values: dict[str, Any]) -> UserPreset:
    """Change a preset; chats already on it keep the settings they copied."""
    if presets_locked():
        raise _locked_error()
    checked = validate_settings(values)
    if name is not None:
        checked["name"] = validate_preset_name(name)
    for field, value in checked.items():
        setattr(preset, field, value)
    return _save(preset, [*checked, "updated_at"])


def user_preset_delete(*, preset: UserPreset) -> None:
    preset.delete()
