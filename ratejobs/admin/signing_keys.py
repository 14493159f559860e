"""The admin's signing-key page: each staff member's own key for job callbacks, whether it
exists and since when, and a button that makes a new secret and shows it on that answer only
(never stored in clear, never in a message or the session)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ratejobs.admin.access import is_staff
from ratejobs.admin.lookups import ShownFiltersOnly
from ratejobs.models import SigningKey
from ratejobs.selectors.signing_keys import signing_key_for
from ratejobs.services.callbacks import signing_key_rotate


@admin.register(SigningKey)
class SigningKeyAdmin(ShownFiltersOnly, admin.ModelAdmin):
    """One page (the list, which leads to the rotation): a key is only ever its owner's."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_staff(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_staff(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[SigningKey]:
        return super().get_queryset(request).filter(user=request.user)

    def get_urls(self) -> list:
        # only these two pages: no change, delete or history page of a secret
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.key_view), name="ratejobs_signingkey_changelist"),
            path("rotate/", wrap(self.rotate_view), name="ratejobs_signingkey_rotate"),
        ]

    def _context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Your signing key for job callbacks",
            "key": signing_key_for(request.user),
            "rotate_url": reverse("admin:ratejobs_signingkey_rotate"),
            **extra,
        }

    def key_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(
            request, "admin/ratejobs/signingkey/page.html", self._context(request)
        )

    def rotate_view(self, request: HttpRequest) -> HttpResponse:
        """GET asks to confirm; POST makes the new secret and shows it in this answer only."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        secret = None
        if request.method == "POST":
            _, secret = signing_key_rotate(user=request.user)
        response = TemplateResponse(
            request,
            "admin/ratejobs/signingkey/page.html",
            self._context(request, confirm=secret is None, secret=secret),
        )
        response["Cache-Control"] = "no-store"
        return response
