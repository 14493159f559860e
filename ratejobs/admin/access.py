"""Who may use ratejobs' admin pages: every active staff member, without per-model grants.

Staff who are not superusers work on their own jobs only (and those jobs' calls and events);
deleting is left to superusers, since it removes results for good.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def is_staff(request: HttpRequest) -> bool:
    return bool(request.user.is_active and request.user.is_staff)


def sees_every_job(request: HttpRequest) -> bool:
    return bool(request.user.is_active and request.user.is_superuser)


class StaffAccess:
    """ModelAdmin permissions for ratejobs' models (mixed in before admin.ModelAdmin)."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_staff(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_staff(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return is_staff(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_staff(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return sees_every_job(request)


class ReadOnlyStaffAccess(StaffAccess):
    """Records written by the workers (calls, throttle events): looked at, never edited."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
