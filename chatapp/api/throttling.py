from __future__ import annotations

from rest_framework.throttling import BaseThrottle

from chatapp.accounting.ratelimit import RateLimited, active_limiter
from chatapp.api.models import ApiKey


class ApiKeyRateThrottle(BaseThrottle):
    """The per-key requests-per-minute limit on /api/ (DRF turns it into 429 + Retry-After).
    Browser sessions are not limited here: they are people, not integrations."""

    _wait: int | None = None

    def allow_request(self, request, view) -> bool:
        if not isinstance(request.auth, ApiKey):
            return True
        try:
            active_limiter().hit(request.auth)
        except RateLimited as exc:
            self._wait = exc.retry_after
            return False
        return True

    def wait(self) -> int | None:
        return self._wait
