"""The usage pages: /usage/ (your own), /usage/all/ and /usage/all.csv (administrators)."""

from __future__ import annotations

import csv

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from chatapp.accounting import selectors

MAX_DAYS = 366


def _days(request: HttpRequest) -> int:
    try:
        return min(max(int(request.GET.get("days", "30")), 1), MAX_DAYS)
    except ValueError:
        return 30


def _admin_only(request: HttpRequest) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("Only administrators see everyone's usage.")


def _page(request: HttpRequest, *, everyone: bool) -> HttpResponse:
    days = _days(request)
    rows = selectors.usage_since(days=days, user=None if everyone else request.user)
    return render(request, "accounting/usage.html", {
        "rows": rows, "totals": selectors.totals(rows), "days": days, "everyone": everyone,
    })


@login_required
def my_usage(request: HttpRequest) -> HttpResponse:
    return _page(request, everyone=False)


@login_required
def all_usage(request: HttpRequest) -> HttpResponse:
    _admin_only(request)
    return _page(request, everyone=True)


@login_required
def all_usage_csv(request: HttpRequest) -> HttpResponse:
    _admin_only(request)
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="usage.csv"'
    out = csv.writer(response)
    out.writerow(["day", "user", "key", "model", *selectors.COUNTS])
    for row in selectors.usage_since(days=_days(request)):
        out.writerow([row.day.isoformat(), row.user.get_username(),
                      row.key.prefix if row.key else "", row.model,
                      *(getattr(row, name) for name in selectors.COUNTS)])
    return response
