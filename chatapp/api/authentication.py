"""Bearer API keys: `Authorization: Bearer pc-xxxxxxxx.<secret>` on /v1/ and /api/."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from chatapp.api import selectors, services
from chatapp.api.models import ApiKey

KEYWORD = "bearer"


class MissingKey(Exception):
    pass


class InvalidKey(Exception):
    pass


def key_for_header(header: str | None) -> ApiKey:
    """The active key the header carries, or MissingKey / InvalidKey (revoked keys are invalid)."""
    if not header:
        raise MissingKey("No API key given: send 'Authorization: Bearer <API key>'.")
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != KEYWORD:
        raise InvalidKey("The Authorization header must be 'Bearer <API key>'.")
    key = selectors.api_key_for_secret(parts[1])
    if key is None:
        raise InvalidKey("Incorrect or revoked API key.")
    services.api_key_touch(key=key)
    return key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """DRF authentication: request.user is the key's owner, request.auth the ApiKey.
    Without an Authorization header it steps aside for session authentication."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        try:
            key = key_for_header(header)
        except (MissingKey, InvalidKey) as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        return key.user, key

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (not 403) to requests without credentials.
        return 'Bearer realm="api"'
