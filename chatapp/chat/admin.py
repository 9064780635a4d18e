from django.contrib import admin

from chatapp.chat.models import Conversation, HistorySummary, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "content", "prompt_tokens", "cached_tokens", "completion_tokens")
    readonly_fields = fields
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "owner", "preset_id", "preset_version", "updated_at")
    list_filter = ("preset_id",)
    search_fields = ("title", "owner__username")
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "id", "conversation", "role", "status", "prompt_tokens", "cached_tokens",
        "completion_tokens", "ttft", "finish_reason",
    )
    list_filter = ("role", "status", "finish_reason")
    readonly_fields = ("token_ids", "generated_token_ids")


@admin.register(HistorySummary)
class HistorySummaryAdmin(admin.ModelAdmin):
    list_display = ("id", "conversation", "messages", "status", "prompt_tokens", "cached_tokens",
                    "updated_at")
    list_filter = ("status",)
    # Made once and never changed: prompts use its stored ids token for token.
    readonly_fields = [f.name for f in HistorySummary._meta.fields]
