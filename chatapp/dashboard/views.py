"""Thin views: the admin dashboard and its JSON, the reset action, /metrics, /healthz, /readyz."""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods

from chatapp.chat import feedback
from chatapp.dashboard import exposition, health, selectors, services
from chatapp.dashboard.title_costs import title_costs

log = logging.getLogger(__name__)


def _range(request: HttpRequest) -> str:
    return request.GET.get("range", "hour")


def dashboard(request: HttpRequest) -> HttpResponse:
    data = selectors.page_data(range_name=_range(request))
    try:
        profile = selectors.prompt_profile()
    except Exception:  # a diagnostic panel must not take the page down
        log.warning("prompt profile failed", exc_info=True)
        profile = None
    context = {
        **admin.site.each_context(request),
        "title": "Prefix cache",
        "data": data,
        "profile": profile,
        "profile_rows": profile.rows() if profile else [],
        "feedback": feedback.summary_by_model_and_preset(),
        "titles": title_costs(),
    }
    return TemplateResponse(request, "dashboard/dashboard.html", context)


def dashboard_data(request: HttpRequest) -> JsonResponse:
    """The figures as data, plus the page's live fragment rendered from them."""
    data = selectors.page_data(range_name=_range(request))
    data["html"] = render_to_string("dashboard/_live.html", {"data": data}, request=request)
    return JsonResponse(data)


@require_http_methods(["GET", "POST"])
def reset_cache(request: HttpRequest, engine_id: str) -> HttpResponse:
    """GET asks for confirmation; POST resets (staff with change rights only)."""
    if not request.user.is_superuser and not request.user.has_perm("dashboard.change_enginestatus"):
        return HttpResponse("You may not reset the prefix cache.", status=403)
    if request.method == "GET":
        context = {**admin.site.each_context(request), "title": "Reset prefix cache",
                   "engine_id": engine_id}
        return TemplateResponse(request, "dashboard/reset_confirm.html", context)
    try:
        outcome = services.prefix_cache_reset(engine_id=engine_id, user=request.user)
    except services.UnknownEngine:
        messages.error(request, f"No engine named {engine_id!r}.")
        return redirect("dashboard:cache")
    if outcome == "done":
        messages.success(request, f"Prefix cache of {engine_id} reset.")
    else:
        messages.info(request, f"Reset of {engine_id} requested; it happens at its next sample.")
    return redirect("dashboard:cache")


def _metrics_allowed(request: HttpRequest) -> bool:
    token = getattr(settings, "METRICS_TOKEN", "")
    if not token:
        return True
    header = request.headers.get("Authorization", "")
    given = header[7:] if header.startswith("Bearer ") else ""
    return hmac.compare_digest(given.encode(), token.encode())


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _metrics_allowed(request):
        response = HttpResponse("A metrics token is required.\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition.metrics_text(),
                        content_type="text/plain; version=0.0.4; charset=utf-8")


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Alive: the process answers HTTP. Nothing else is checked (that is /readyz)."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    ready, checks = health.readiness()
    return JsonResponse({"status": "ready" if ready else "unready", "checks": checks,
                         "models": health.models()}, status=200 if ready else 503)
