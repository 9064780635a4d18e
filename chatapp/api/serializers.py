"""DRF serializers of the conversations API: input checks and the documented shapes."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from chatapp.api.chat_settings_serializers import (
    MaxNewTokensField,
    SystemPromptField,
    TemperatureField,
    TopPField,
)
from chatapp.chat.errors import InvalidInput
from chatapp.chat.models import Conversation, ConversationTag, Message
from chatapp.chat.payloads import usage_dict
from chatapp.chat.services import MAX_TAGS, validate_tags, validate_title, validate_user_text
from chatapp.generation import model_cards, served_models


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of turning them into text."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field(OpenApiTypes.STR)
class UserTextField(serializers.Field):
    """A user's message. The rule (text, not blank, at most MAX_USER_MESSAGE_CHARS, nothing
    a tokenizer cannot take) has one owner, chatapp.chat.services.validate_user_text,
    which the chat page and /v1 apply too: this field only defers to it."""

    def to_internal_value(self, data: object) -> str:
        try:
            return validate_user_text(data)
        except InvalidInput as exc:
            raise serializers.ValidationError(exc.message, code=exc.code) from None

    def to_representation(self, value: str) -> str:
        return value


class TitleField(StrictCharField):
    """A conversation's title. The rule has one owner, chatapp.chat.services.validate_title,
    which the chat page applies too: this field defers to it (its max_length only
    documents the limit in the schema)."""

    def __init__(self, **kwargs):
        super().__init__(max_length=Conversation.TITLE_MAX_CHARS, **kwargs)

    def run_validation(self, data=serializers.empty):
        is_empty, data = self.validate_empty_values(data)
        if is_empty:
            return data
        try:
            return validate_title(data, allow_blank=self.allow_blank)
        except InvalidInput as exc:
            raise serializers.ValidationError(exc.message, code=exc.code) from None


MAX_VARIABLES = 64
MAX_VARIABLE_NAME_CHARS = 64


class VariablesField(serializers.DictField):
    """Preset variables: names are checked first, so no error quotes a huge name (DRF
    keys its per-value errors by name)."""

    def to_internal_value(self, data: object) -> dict:
        if isinstance(data, dict):
            if len(data) > MAX_VARIABLES:
                raise serializers.ValidationError(f"At most {MAX_VARIABLES} variables.")
            if any(len(str(name)) > MAX_VARIABLE_NAME_CHARS for name in data):
                raise serializers.ValidationError(
                    f"Variable names are at most {MAX_VARIABLE_NAME_CHARS} characters."
                )
        return super().to_internal_value(data)


ORDERINGS = ("updated_at", "-updated_at", "created_at", "-created_at", "title", "-title")


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField()
    errors = serializers.DictField(required=False, help_text="Per-field messages (400 only).")


class PresetSerializer(serializers.Serializer):
    id = serializers.CharField()
    version = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField(allow_blank=True)


class ConversationSerializer(serializers.ModelSerializer):
    current_leaf_id = serializers.IntegerField(allow_null=True, read_only=True)
    message_count = serializers.SerializerMethodField()
    model = serializers.SerializerMethodField(help_text="The model that answers it (a /v1/models id).")
    tags = serializers.SerializerMethodField()
    user_preset_id = serializers.IntegerField(
        allow_null=True, read_only=True, help_text="The personal preset it was started on "
        "or last given (GET/PATCH its settings at settings/).")

    class Meta:
        model = Conversation
        fields = [
            "id",
            "title",
            "preset_id",
            "preset_version",
            "preset_variables",
            "model",
            "system_prompt",
            "temperature",
            "top_p",
            "max_new_tokens",
            "user_preset_id",
            "pinned",
            "archived",
            "tags",
            "current_leaf_id",
            "message_count",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_model(self, obj: Conversation) -> str:
        return served_models.alias_of(obj.model)

    def get_tags(self, obj: Conversation) -> list[str]:
        return [t.name for t in obj.tags.all()]  # prefetched by the list

    def get_message_count(self, obj: Conversation) -> int:
        count = getattr(obj, "message_count", None)
        return count if count is not None else obj.messages.count()


class ConversationCreateSerializer(serializers.Serializer):
    title = TitleField(required=False, allow_blank=True, default="")
    preset_id = StrictCharField(max_length=64, required=False, allow_null=True, default=None)
    preset_version = StrictCharField(
        max_length=64, required=False, allow_null=True, default=None
    )
    variables = VariablesField(
        child=StrictCharField(max_length=4000),
        required=False,
        default=dict,
        help_text="Values of the preset's variables (text).",
    )
    model = StrictCharField(
        max_length=64, required=False, allow_null=True, default=None,
        help_text="The model that answers it (a /v1/models id); unset: the default.",
    )
    user_preset_id = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1,
        help_text="Start it on this personal preset (its system prompt, settings and model).")
    system_prompt = SystemPromptField(help_text="Its own system prompt (blank: the preset's).")
    temperature = TemperatureField()
    top_p = TopPField()
    max_new_tokens = MaxNewTokensField()

    def validate_model(self, value: str | None) -> str:
        """The value the conversation stores; the catalog's message for a name not served."""
        try:
            return model_cards.conversation_model(value)
        except InvalidInput as exc:
            raise serializers.ValidationError(exc.message, code=exc.code) from None


class ConversationRenameSerializer(serializers.Serializer):
    """What PATCH changes: any of these, at least one."""

    title = TitleField(required=False)
    pinned = serializers.BooleanField(required=False, help_text="Pinned ones head the chat "
                                      "page's list.")
    archived = serializers.BooleanField(required=False, help_text="Archived ones leave the "
                                        "list (still found by `search`); false restores one.")
    tags = serializers.ListField(
        child=StrictCharField(max_length=ConversationTag.NAME_MAX_CHARS, allow_blank=True),
        required=False, max_length=MAX_TAGS,
        help_text=f"Replaces the tags (at most {MAX_TAGS}, each at most "
                  f"{ConversationTag.NAME_MAX_CHARS} characters).",
    )

    def validate_tags(self, value: list[str]) -> list[str]:
        try:
            return validate_tags(value)
        except InvalidInput as exc:
            raise serializers.ValidationError(exc.message, code=exc.code) from None

    def validate(self, attrs: dict) -> dict:
        if not attrs:
            raise serializers.ValidationError("Send at least one of title, pinned, archived, "
                                              "tags.", code="required")
        return attrs


class ConversationFilterSerializer(serializers.Serializer):
    search = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=200,
        help_text="Matches titles and message text (case-insensitive).",
    )
    preset_id = serializers.CharField(required=False, max_length=64)
    archived = serializers.BooleanField(
        required=False, allow_null=True, default=None,
        help_text="true: archived ones only; false: the others. Unset: archived ones are left "
                  "out unless `search` is given.",
    )
    pinned = serializers.BooleanField(required=False, allow_null=True, default=None)
    tag = serializers.CharField(required=False, allow_blank=True, default="",
                                max_length=ConversationTag.NAME_MAX_CHARS,
                                help_text="Only conversations with this tag.")
    ordering = serializers.ChoiceField(
        choices=ORDERINGS, required=False, default="-updated_at",
        # DRF's message quotes the value whole; name the choices instead.
        error_messages={"invalid_choice": f"Use one of {', '.join(ORDERINGS)}."},
    )


class PrefixCacheSerializer(serializers.Serializer):
    reason = serializers.ChoiceField(
        choices=["full", "evicted", "cold", "diverged", "disabled"],
        help_text="Why the prefix-cache match ended where it did, from this tenant's own "
                  "history only (another tenant's cached tokens are 'cold' here).",
    )
    matched_tokens = serializers.IntegerField()
    tier_tokens = serializers.IntegerField(help_text="Of those, restored from host/disk.")
    evicted_from = serializers.CharField(allow_null=True, help_text="pool or tier")
    diverged_at = serializers.IntegerField(required=False, help_text="The first token that "
                                           "differs from the previous turn's prompt.")
    diverged_message_id = serializers.IntegerField(required=False, allow_null=True)
    diverged_segment = serializers.CharField(required=False)
    changed = serializers.ListField(
        child=serializers.ChoiceField(choices=["system prompt", "model"]), required=False,
        help_text="The chat's settings that changed since its previous reply: this prompt "
                  "was built anew, so the cache was cold because of it.")


class UsageSerializer(serializers.Serializer):
    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    ttft_ms = serializers.FloatField(allow_null=True)
    prefix_cache = PrefixCacheSerializer(required=False, help_text="The cache receipt (replies "
                                         "generated since receipts were kept).")


class MessageSerializer(serializers.ModelSerializer):
    children_ids = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    token_count = serializers.SerializerMethodField()
    finish_reason = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()

    class Meta:
        model = Message
        fields = [
            "id",
            "parent_id",
            "children_ids",
            "role",
            "content",
            "status",
            "finish_reason",
            "error",
            "token_count",
            "usage",
            "can_continue",
            "created_at",
        ]
        read_only_fields = fields

    def get_children_ids(self, obj: Message) -> list[int]:
        children = self.context.get("children")
        if children is not None:
            return children.get(obj.pk, [])
        return list(obj.children.order_by("created_at", "id").values_list("pk", flat=True))

    @extend_schema_field(UsageSerializer(allow_null=True))
    def get_usage(self, obj: Message) -> dict | None:
        return usage_dict(obj)

    def get_token_count(self, obj: Message) -> int:
        """Ids this message contributes to later prompts (its whole turn, markers included)."""
        return len(obj.token_ids or [])

    def get_finish_reason(self, obj: Message) -> str | None:
        return obj.finish_reason or None

    def get_error(self, obj: Message) -> str | None:
        return obj.error or None


class MessageTreeSerializer(serializers.Serializer):
    conversation_id = serializers.IntegerField()
    current_leaf_id = serializers.IntegerField(allow_null=True)
    root_ids = serializers.ListField(child=serializers.IntegerField())
    messages = MessageSerializer(many=True)


class MessageCreateSerializer(serializers.Serializer):
    content = UserTextField(help_text="The message text (at most MAX_USER_MESSAGE_CHARS "
                            "characters, 16000 by default).")
    parent_id = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1,
        help_text="The reply to continue after (default: the conversation's current leaf).",
    )
    stream = serializers.BooleanField(
        required=False, default=False,
        help_text="Stream the reply as server-sent events instead of waiting for it.",
    )


class MessageContinueSerializer(serializers.Serializer):
    stream = serializers.BooleanField(
        required=False, default=False,
        help_text="Stream the rest of the reply as server-sent events instead of waiting.",
    )


class StreamEventSerializer(serializers.Serializer):
    """One server-sent event of a streamed reply (`event:` and `data:` lines)."""

    event = serializers.ChoiceField(
        choices=["message.created", "message.started", "message.delta", "message.done"]
    )
    data = serializers.CharField(help_text="The event as JSON; its `type` repeats `event`.")


class TurnSerializer(serializers.Serializer):
    user_message = MessageSerializer()
    reply = MessageSerializer()


class ExportMessageSerializer(MessageSerializer):
    generated_token_count = serializers.SerializerMethodField()
    prompt_tokens = serializers.IntegerField(allow_null=True)
    cached_tokens = serializers.IntegerField(allow_null=True)
    completion_tokens = serializers.IntegerField(allow_null=True)
    ttft_ms = serializers.SerializerMethodField()

    class Meta(MessageSerializer.Meta):
        fields = MessageSerializer.Meta.fields + [
            "generated_token_count",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "ttft_ms",
        ]
        read_only_fields = fields

    def get_generated_token_count(self, obj: Message) -> int:
        return len(obj.generated_token_ids or [])

    def get_ttft_ms(self, obj: Message) -> float | None:
        return None if obj.ttft is None else round(obj.ttft * 1000, 1)


class ExportTotalsSerializer(serializers.Serializer):
    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    replies = serializers.IntegerField()


class ExportSerializer(serializers.Serializer):
    conversation = ConversationSerializer()
    current_branch_ids = serializers.ListField(child=serializers.IntegerField())
    messages = ExportMessageSerializer(many=True)
    usage = ExportTotalsSerializer()
