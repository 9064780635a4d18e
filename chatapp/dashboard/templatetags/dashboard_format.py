"""Formatting for the dashboard: rates as percentages, seconds as milliseconds, "—" for none."""

from __future__ import annotations

from django import template

register = template.Library()

NONE = "—"


def _missing(value) -> bool:
    return value is None or value == ""


@register.filter
def pct(value) -> str:
    return NONE if _missing(value) else f"{float(value) * 100:.1f}%"


@register.filter
def ms(value) -> str:
    return NONE if _missing(value) else f"{float(value) * 1000:.0f} ms"


@register.filter
def share(part, whole) -> str:
    """part / whole as a CSS percentage number (for the block gauge)."""
    try:
        return f"{100 * float(part) / float(whole):.2f}" if whole else "0"
    except (TypeError, ValueError):
        return "0"


@register.filter
def dash(value):
    return NONE if _missing(value) else value
