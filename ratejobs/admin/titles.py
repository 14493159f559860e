"""Titles of the pages of records operators look at rather than edit (jobs, calls, throttle
events): "Jobs" and the job's name, not Django's "Select job to change" and "Change job"."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.text import capfirst


class RecordTitles:
    """For a ModelAdmin: its list titled by the model's plural, each record's page by the
    record's own name."""

    opts: Any

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> Any:
        title = capfirst(str(self.opts.verbose_name_plural))
        return super().changelist_view(request, {"title": title, **(extra_context or {})})  # type: ignore[misc]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        if obj is not None and not add:
            # The name is the title: Django's subtitle would only repeat it.
            context.update(title=str(obj), subtitle=None)
        return super().render_change_form(request, context, add, change, form_url, obj)  # type: ignore[misc]
