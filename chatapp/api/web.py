"""The API-key page (browser, session auth): make a key (shown once), list, revoke."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from chatapp.api import selectors, services


@login_required
@require_http_methods(["GET", "POST"])
def keys_page(request: HttpRequest) -> HttpResponse:
    new_key = None
    if request.method == "POST":
        _, new_key = services.api_key_create(user=request.user, name=request.POST.get("name", ""))
    context = {"keys": selectors.api_key_list(user=request.user), "new_key": new_key}
    # The key is in this response only: never cache it anywhere.
    response = render(request, "api/keys.html", context)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    key = selectors.api_key_get(user=request.user, key_id=key_id)
    if key is None:
        raise Http404("API key not found.")
    services.api_key_revoke(key=key)
    return redirect("api:keys")
