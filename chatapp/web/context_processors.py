from django.conf import settings
from django.http import HttpRequest


def chat(request: HttpRequest) -> dict:
    """What every page needs to know: whether the sign-up link is shown."""
    return {"allow_signup": settings.CHAT_ALLOW_SIGNUP}
