"""Which lookups an admin list takes from its query string: those of the filters it shows.

Django lets a changelist filter by any lookup on its model's own fields unless told otherwise,
so `?default_headers__X-Api-Key__regex=^sk_` lists an API or not, and reads a value the page
masks one character at a time. Every admin here, Django's and DRF's included, takes only the
parameters of its shown filters (and its date hierarchy); anything else is a 400.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.filters import FieldListFilter, ListFilter
from django.contrib.admin.utils import get_fields_from_path
from django.http import HttpRequest

DATE_HIERARCHY_PARTS = ("year", "month", "day")


class ShownFiltersOnly:
    """ModelAdmin mixin: lookups allowed only for the filters the list shows."""

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in shown_filter_parameters(self, request)


def shown_filter_parameters(model_admin: Any, request: HttpRequest | None) -> set[str]:
    """The query parameters of the filters `model_admin` shows to `request`'s user."""
    filters = (
        model_admin.get_list_filter(request) if request is not None else model_admin.list_filter
    )
    parameters: set[str] = set()
    for item in filters:
        if isinstance(item, type) and issubclass(item, ListFilter):
            # a SimpleListFilter reads one parameter (and the names it had before, if it
            # says so); its queryset() decides what it means
            parameters.add(item.parameter_name)
            parameters.update(getattr(item, "older_parameters", ()))
            continue
        path, make = item if isinstance(item, (list, tuple)) else (item, FieldListFilter.create)
        field = get_fields_from_path(model_admin.model, path)[-1]
        spec = make(field, request, {}, model_admin.model, model_admin, field_path=path)
        parameters.update(spec.expected_parameters())
    if model_admin.date_hierarchy:
        parameters.update(f"{model_admin.date_hierarchy}__{part}" for part in DATE_HIERARCHY_PARTS)
    return parameters


def only_shown_filters_everywhere(site: admin.AdminSite) -> None:
    """Give every admin registered on `site` (Django's users and groups, DRF's tokens) the
    same rule as ours, by registering it again as a subclass with ShownFiltersOnly."""
    for model, model_admin in list(site._registry.items()):
        if isinstance(model_admin, ShownFiltersOnly):
            continue
        kind = type(model_admin)
        strict = type(kind.__name__, (ShownFiltersOnly, kind), {"__module__": kind.__module__})
        site.unregister(model)
        site.register(model, strict)
