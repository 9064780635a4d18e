from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class UserLimits(models.Model):
    """One user's own limits; a blank field takes its setting (LIMITS_USER_*)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="limits"
    )
    rpm = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests per minute, all the user's keys together.")
    concurrent = models.PositiveIntegerField(
        null=True, blank=True, help_text="Replies at once, all the user's keys together.")
    tokens_per_day = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Weighted prompt+completion tokens per UTC day; 0: none.")
    tokens_per_month = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Weighted prompt+completion tokens per UTC month; 0: none.")

    class Meta:
        verbose_name_plural = "user limits"

    def __str__(self) -> str:
        return f"limits of {self.user}"


class DailyUsage(models.Model):
    """What one user spent through one key (none: the chat page) on one model in one UTC day."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_days"
    )
    key = models.ForeignKey(
        "api.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="usage_days"
    )
    model = models.CharField(max_length=64, blank=True, default="")
    day = models.DateField()
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-day", "user_id", "model"]
        # Two partial constraints: a NULL key would otherwise never collide.
        constraints = [
            models.UniqueConstraint(fields=["user", "key", "model", "day"],
                                    condition=Q(key__isnull=False), name="usage_per_key_day"),
            models.UniqueConstraint(fields=["user", "model", "day"],
                                    condition=Q(key__isnull=True), name="usage_per_page_day"),
        ]
