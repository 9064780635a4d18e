"""Writes of the API app: keys (make, revoke, mark used) and remembered reply ids."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from chatapp.api.models import ApiKey, RememberedReply

KEY_PREFIX = "pc-"
# last_used_at is a hint for people, not an audit log: one write a minute per key at most.
TOUCH_EVERY = timedelta(minutes=1)


def sha256_hex(text: str) -> str:
    """How a key's secret and a remembered reply's text are stored and looked up."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def api_key_create(
    *,
    user: AbstractBaseUser,
    name: str = "",
    allow_cache_salt: bool = False,
    rate_limit_rpm: int | None = None,
    max_concurrent: int | None = None,
) -> tuple[ApiKey, str]:
    """A new key for `user`: (the stored row, the key itself). The key is never stored;
    show it once and forget it."""
    for _ in range(5):  # a prefix collision is possible (4 random bytes), just draw again
        prefix = KEY_PREFIX + secrets.token_hex(4)
        raw = f"{prefix}.{secrets.token_urlsafe(32)}"
        try:
            with transaction.atomic():
                key = ApiKey.objects.create(
                    user=user,
                    name=(name or "").strip()[:100],
                    prefix=prefix,
                    key_hash=sha256_hex(raw),
                    allow_cache_salt=allow_cache_salt,
                    rate_limit_rpm=rate_limit_rpm,
                    max_concurrent=max_concurrent,
                )
        except IntegrityError:
            continue
        return key, raw
    raise RuntimeError("could not draw a unique API key prefix")


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke now: authentication reads the row on every request, so it takes effect at once."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def api_key_touch(*, key: ApiKey) -> None:
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at >= TOUCH_EVERY:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now


def replies_remember(*, tenant: str, replies: Iterable[tuple[str, list[int]]]) -> None:
    """Remember the generated ids of each (text, ids) for API_REMEMBER_IDS_TTL_S seconds:
    a request sending the text back as an assistant message gets them spliced into its
    prompt (a fresh encoding could tokenize differently and miss the cache from there)."""
    now = timezone.now()
    expires = now + timedelta(seconds=settings.API_REMEMBER_IDS_TTL_S)
    for text, ids in replies:
        if not text or not ids:
            continue
        RememberedReply.objects.update_or_create(
            tenant=tenant,
            text_hash=sha256_hex(text),
            defaults={"token_ids": list(ids), "expires_at": expires},
        )
    # Bounded memory: expired rows go on the next write (cheap with the index).
    RememberedReply.objects.filter(expires_at__lte=now).delete()
