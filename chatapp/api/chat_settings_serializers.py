"""Serializers of a chat's settings and of personal presets. The rules have one owner,
chatapp.chat.chat_settings, which the chat page applies too: these fields defer to it."""

from __future__ import annotations

from collections.abc import Callable

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from chatapp.chat import chat_settings
from chatapp.chat.errors import InvalidInput
from chatapp.chat.models import UserPreset
from chatapp.generation import model_cards, served_models


class _RuleField(serializers.Field):
    """A field whose value `rule` checks and normalises (InvalidInput: a 400 naming it)."""

    rule: Callable[[object], object]

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def validate_empty_values(self, data):
        # null is a value here ("the server's default"), checked by the rule.
        if data is None:
            return False, data
        return super().validate_empty_values(data)

    def to_internal_value(self, data: object) -> object:
        try:
            return type(self).rule(data)
        except InvalidInput as exc:
            raise serializers.ValidationError(exc.message, code=exc.code) from None

    def to_representation(self, value: object) -> object:
        return value


@extend_schema_field({"type": "string", "description": "The chat's own system prompt; "
                      "blank: the preset's. Sent as written, never rendered as a template."})
class SystemPromptField(_RuleField):
    rule = staticmethod(chat_settings.validate_system_prompt)


@extend_schema_field({"type": "number", "nullable": True, "minimum": 0, "maximum": 2})
class TemperatureField(_RuleField):
    rule = staticmethod(chat_settings.validate_temperature)


@extend_schema_field({"type": "number", "nullable": True, "minimum": 0, "exclusiveMinimum": True,
                      "maximum": 1})
class TopPField(_RuleField):
    rule = staticmethod(chat_settings.validate_top_p)


@extend_schema_field({"type": "integer", "nullable": True, "minimum": 1,
                      "description": "At most the server's CHAT_MAX_NEW_TOKENS."})
class MaxNewTokensField(_RuleField):
    rule = staticmethod(chat_settings.validate_max_new_tokens)


@extend_schema_field({"type": "string", "nullable": True,
                      "description": "A /v1/models id; blank or null: the default."})
class ModelField(_RuleField):
    # Checked here, at the edge: the chat app stores what the model catalog gives.
    rule = staticmethod(model_cards.conversation_model)


class SettingsInputSerializer(serializers.Serializer):
    """Some of a chat's settings; those left out stay as they are. null: the server's."""

    system_prompt = SystemPromptField()
    temperature = TemperatureField()
    top_p = TopPField()
    max_new_tokens = MaxNewTokensField()
    model = ModelField()

    def validate(self, attrs: dict) -> dict:
        unknown = sorted(set(self.initial_data) - set(self.fields) - self.extra_allowed)
        if unknown:
            raise serializers.ValidationError({unknown[0]: "Unknown field."})
        return attrs

    extra_allowed: frozenset[str] = frozenset()


class ConversationSettingsInputSerializer(SettingsInputSerializer):
    user_preset_id = serializers.IntegerField(
        required=False, min_value=1,
        help_text="Apply this personal preset (all its settings), the fields given on top.")

    extra_allowed = frozenset({"user_preset_id"})


class SettingsSerializer(serializers.Serializer):
    system_prompt = serializers.CharField(allow_blank=True)
    temperature = serializers.FloatField(allow_null=True)
    top_p = serializers.FloatField(allow_null=True)
    max_new_tokens = serializers.IntegerField(allow_null=True)
    model = serializers.SerializerMethodField()

    def get_model(self, obj) -> str:
        return served_models.alias_of(obj.model)


class ConversationSettingsSerializer(SettingsSerializer):
    user_preset_id = serializers.IntegerField(allow_null=True)
    user_preset_name = serializers.SerializerMethodField()

    def get_user_preset_name(self, obj) -> str | None:
        return obj.user_preset.name if obj.user_preset_id else None


class UserPresetSerializer(SettingsSerializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class UserPresetInputSerializer(SettingsInputSerializer):
    name = serializers.CharField(required=False, max_length=UserPreset.NAME_MAX_CHARS,
                                 help_text="Unique among your presets.")

    extra_allowed = frozenset({"name"})
