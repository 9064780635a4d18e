"""Formatting for the dashboard: rates as percentages, seconds as milliseconds, and a word
for a missing value that says why it is missing (the template passes it; "n/a" when no
word fits better)."""

from __future__ import annotations

from django import template

register = template.Library()

MISSING = "n/a"


def _missing(value) -> bool:
    return value is None or value == ""


@register.filter
def pct(value, missing: str = MISSING) -> str:
    return missing if _missing(value) else f"{float(value) * 100:.1f}%"


@register.filter
def ms(value, missing: str = MISSING) -> str:
    return missing if _missing(value) else f"{float(value) * 1000:.0f} ms"


@register.filter
def share(part, whole) -> str:
    """part / whole as a CSS percentage number (for the block gauge)."""
    try:
        return f"{100 * float(part) / float(whole):.2f}" if whole else "0"
    except (TypeError, ValueError):
        return "0"


@register.filter
def otherwise(value, missing: str = MISSING):
    """The value, or the word for its absence."""
    return missing if _missing(value) else value
