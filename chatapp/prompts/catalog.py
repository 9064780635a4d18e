"""The presets a conversation can start with, as the chat and the APIs show them."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from chatapp.prompts import presets

DEFAULT_PRESET = "general"


class UnknownPreset(ValueError):
    pass


@dataclass(frozen=True)
class PresetRef:
    id: str
    version: str
    title: str
    description: str = ""


def _ref(preset) -> PresetRef:
    return PresetRef(preset.id, preset.version, preset.title or preset.id, preset.description)


def available_presets() -> list[PresetRef]:
    return [_ref(p) for p in presets.list_presets()]


def default_preset_id() -> str:
    ids = [p.id for p in available_presets()]
    wanted = getattr(settings, "CHAT_DEFAULT_PRESET", DEFAULT_PRESET)
    if wanted in ids or not ids:
        return wanted
    return ids[0]


def resolve_preset(preset_id: str | None, version: str | None = None) -> PresetRef:
    """The preset (its current version unless one is named); UnknownPreset if unknown."""
    preset_id = preset_id or default_preset_id()
    if not isinstance(preset_id, str):
        raise UnknownPreset("Unknown preset.")
    try:
        return _ref(presets.get_preset(preset_id, version or None))
    except ValueError as exc:  # PresetError included
        raise UnknownPreset(f"Unknown preset {preset_id!r}.") from exc
