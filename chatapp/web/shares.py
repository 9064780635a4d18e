"""/s/<token>/: a shared branch of a conversation, read-only, as it was when shared."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from chatapp.chat import shares
from chatapp.chat.errors import NotFound


@require_GET
def shared_conversation(request: HttpRequest, token: str) -> HttpResponse:
    if settings.CHAT_SHARE_REQUIRES_LOGIN and not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    try:
        share = shares.shared_get(token=token)
    except NotFound as exc:
        raise Http404(exc.message) from None
    owner = share.conversation.owner.get_username() if share.show_owner else None
    response = render(request, "chat/shared.html", {"share": share, "owner": owner})
    # The link is the key: keep it out of other sites' Referer headers and search indexes.
    response["Referrer-Policy"] = "no-referrer"
    response["X-Robots-Tag"] = "noindex"
    return response
