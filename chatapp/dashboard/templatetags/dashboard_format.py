"""Formatting for the dashboard: rates as percentages, seconds as milliseconds, "—" for none."""

from __future__ import annotations

from django import template

register = template.Library()

NONE = "—"


@register.filter
def pct(value) -> str:
    if value is None or value == "":
        return NONE
    return f"{float(value) * 100:.1f}%"


@register.filter
def ms(value) -> str:
    if value is None or value == "":
        return NONE
    return f"{float(value) * 1000:.0f} ms"


@register.filter
def share(part, whole) -> str:
    """part / whole as a CSS percentage number (for the block gauge)."""
    try:
        return f"{100 * float(part) / float(whole):.2f}" if whole else "0"
    except (TypeError, ValueError):
        return "0"


@register.filter
def dash(value):
    return NONE if value is None or value == "" else value
