"""Cells of the admin's lists: long text clipped to the column (whole on hover), datetimes to
the second."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ratejobs.text import moment_text


def clipped(text: str) -> SafeString:
    """The text in a span that admin.css cuts with an ellipsis (`.rj-clip`), whole in its title,
    so a long base URL, path or job name never widens the table past the screen."""
    return format_html('<span class="rj-clip" title="{}">{}</span>', text, text)


def clock_column(field: str, description: str = "") -> Any:
    """A ModelAdmin display of a datetime field to the second ("2026-11-24 14:03:27"), sortable
    by it: Django's own rendering shows the minute only."""

    @admin.display(description=description or field.replace("_", " "), ordering=field)
    def column(model_admin: admin.ModelAdmin, obj: Any) -> str:
        return moment_text(getattr(obj, field))

    return column
