from django.contrib import admin

from chatapp.api.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "user__username"]
    # Keys are made by their owners (page or command); the hash is of no use to anyone here.
    exclude = ["key_hash"]
    readonly_fields = ["prefix", "user", "created_at", "last_used_at"]

    def has_add_permission(self, request) -> bool:
        return False
