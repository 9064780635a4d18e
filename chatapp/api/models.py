"""API keys and the per-tenant memory of generated reply ids.

A key is stored as its prefix and a SHA-256 of the whole key (docs/api.md, "API keys"): keys
carry 32 random bytes, so a plain hash is enough, nothing to brute-force as passwords.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    # Lets the key's requests send their own `cache_salt` (a partition inside the tenant).
    allow_cache_salt = models.BooleanField(default=False)
    # Per-key overrides of API_RATE_LIMIT_RPM / API_MAX_CONCURRENT (None: the setting).
    rate_limit_rpm = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class RememberedReply(models.Model):
    """The ids the engine generated for a reply text, so the text can be spliced back as ids.
    Keyed by tenant and a hash of the text: tenants never share what they remember."""

    tenant = models.CharField(max_length=64)
    text_hash = models.CharField(max_length=64)
    token_ids = models.JSONField(default=list)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "text_hash"], name="api_remembered_unique")
        ]


class StoredResponse(models.Model):
    """A /v1/responses response kept with `store: true`, owned by its key's user.

    A later request names it as `previous_response_id`: the chain is replayed from each
    row's own input and output, the reply as the ids the engine generated, so the next
    prompt extends this one token for token (docs/api.md, "/v1/responses")."""

    id = models.CharField(max_length=64, primary_key=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="stored_responses"
    )
    # By id, not a foreign key: a deleted ancestor leaves a chain that can no longer be
    # replayed, which the next request is told, rather than a silently shorter history.
    previous_response_id = models.CharField(max_length=64, blank=True, default="")
    # The served model that generated the reply: its ids mean nothing to another tokenizer.
    model = models.CharField(max_length=200, blank=True, default="")
    # This turn's new messages (chat shape), its reply as an assistant message, and the
    # ids that reply was generated as (a forced call's opening included).
    input_messages = models.JSONField(default=list)
    output_message = models.JSONField(default=dict)
    output_ids = models.JSONField(default=list)
    body = models.JSONField(default=dict)  # the Response object, as GET returns it
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["user", "created_at"], name="api_response_user_created")]

    def __str__(self) -> str:
        return self.id
