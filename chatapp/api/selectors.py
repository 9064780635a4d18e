"""Reads of the API app: keys by their secret, a user's keys, remembered reply ids."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.utils import timezone

from chatapp.api.models import ApiKey, RememberedReply
from chatapp.api.services import sha256_hex


def api_key_for_secret(raw_key: str) -> ApiKey | None:
    """The active key whose secret this is, with its user; None for unknown or revoked keys
    and keys of inactive users."""
    if not raw_key or len(raw_key) > 200:
        return None
    return ApiKey.objects.select_related("user").filter(
        key_hash=sha256_hex(raw_key), revoked_at__isnull=True, user__is_active=True
    ).first()


def api_key_list(*, user: AbstractBaseUser) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(user=user)


def api_key_get(*, user: AbstractBaseUser, key_id: int) -> ApiKey | None:
    return ApiKey.objects.filter(user=user, pk=key_id).first()


def remembered_ids(*, tenant: str, texts: Iterable[str]) -> dict[str, list[int]]:
    """text -> the ids generated for it, for the texts this tenant's replies had (unexpired)."""
    by_hash = {sha256_hex(t): t for t in texts if t}
    if not by_hash:
        return {}
    rows = RememberedReply.objects.filter(
        tenant=tenant, text_hash__in=list(by_hash), expires_at__gt=timezone.now()
    ).values_list("text_hash", "token_ids")
    return {by_hash[h]: list(ids) for h, ids in rows}
