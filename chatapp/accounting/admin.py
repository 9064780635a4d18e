from django.contrib import admin

from chatapp.accounting.models import DailyUsage, UserLimits


@admin.register(UserLimits)
class UserLimitsAdmin(admin.ModelAdmin):
    list_display = ("user", "rpm", "concurrent", "tokens_per_day", "tokens_per_month")
    search_fields = ("user__username",)
    autocomplete_fields = ("user",)


@admin.register(DailyUsage)
class DailyUsageAdmin(admin.ModelAdmin):
    list_display = ("day", "user", "key", "model", "requests", "prompt_tokens", "cached_tokens",
                    "completion_tokens", "errors")
    list_filter = ("day", "model")
    search_fields = ("user__username",)
    readonly_fields = [f.name for f in DailyUsage._meta.fields]
