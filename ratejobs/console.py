"""The ratejobs console: an admin site named for ratejobs, whose home is the overview and whose
sidebar lists what operators use first.

A project opts in by listing ConsoleAdminConfig in INSTALLED_APPS instead of
"django.contrib.admin" (Django's documented way to replace the default site); a host that keeps
its own admin keeps its own name, home page and sidebar. Models register with `admin.site`,
which is then a ConsoleSite.

This module lives outside ratejobs.admin on purpose: importing that package registers the
models, which must not happen while INSTALLED_APPS are being loaded (this AppConfig), nor from
inside the lazy `admin.site` as it builds itself (the default site), or the registrations would
land on a site that is thrown away.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse

# Sidebar order, by how often operators open them; models not named keep Django's order after.
APP_ORDER = ("ratejobs", "auth", "authtoken")
MODEL_ORDER = {
    "ratejobs": ("Job", "Api", "Call", "ThrottleEvent", "SigningKey"),
    "auth": ("User", "Group"),
}


def _ordered(items: list[dict[str, Any]], order: tuple[str, ...], key: str) -> list[dict]:
    """`items` sorted by where their `key` stands in `order`; those not in it last, as they
    were (sorted() is stable)."""
    rank = {name: index for index, name in enumerate(order)}
    return sorted(items, key=lambda item: rank.get(item[key], len(order)))


class ConsoleSite(AdminSite):
    site_header = "ratejobs"
    site_title = "ratejobs"
    index_title = "Overview"

    def overview_url(self) -> str | None:
        """The overview's address, or None where the project did not include ratejobs.urls."""
        try:
            return reverse("ratejobs_overview")
        except NoReverseMatch:
            return None

    def index(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        """The overview itself, under the admin's own address: sign-in's `next=/admin/`, the
        header's home link and every breadcrumb's "Home" all land where operators start."""
        if self.overview_url() is None:
            return super().index(request, extra_context)
        from ratejobs.admin.overview import overview_view  # registers the models: not at load

        return overview_view(request)

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict]:
        apps = _ordered(super().get_app_list(request, app_label), APP_ORDER, "app_label")
        for app in apps:
            order = MODEL_ORDER.get(app["app_label"], ())
            app["models"] = _ordered(app["models"], order, "object_name")
            if app["app_label"] == "ratejobs":
                app["models"] = [*self._overview_entry(), *app["models"]]
        return apps

    def _overview_entry(self) -> list[dict[str, Any]]:
        """The overview as the first row of ratejobs' models: the templates render a row with a
        link and no add button, which is all a page that is not a model needs."""
        url = self.overview_url()
        if url is None:
            return []
        return [
            {
                "name": "Overview",
                "object_name": "Overview",
                "admin_url": url,
                "add_url": None,
                "view_only": True,
                "perms": {"add": False, "change": False, "delete": False, "view": True},
            }
        ]


class ConsoleAdminConfig(AdminConfig):
    default_site = "ratejobs.console.ConsoleSite"
