"""The admin's side of the role model (ratejobs.permissions): which ratejobs pages and actions
each staff member gets, without per-model grants for jobs, calls and events.

Every active staff member submits jobs and follows their own; APIs are read by every staff
member and changed (limits, base_url, credentials, block, reset) only by those who may manage
them. Deleting is left to superusers, since it removes results for good.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from ratejobs import permissions


def is_staff(request: HttpRequest) -> bool:
    return permissions.can_use_admin(request.user)


def sees_every_job(request: HttpRequest) -> bool:
    return permissions.sees_every_job(request.user)


class StaffAccess:
    """ModelAdmin permissions for ratejobs' models (mixed in before admin.ModelAdmin)."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_staff(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_staff(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return is_staff(request) and permissions.can_submit_jobs(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_staff(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_staff(request) and permissions.may_delete_records(request.user)


class ManagerAccess(StaffAccess):
    """APIs: read by every staff member; created, changed, blocked and reset by managers."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return is_staff(request) and permissions.can_manage_apis(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_staff(request) and permissions.can_manage_apis(request.user)


class ReadOnlyStaffAccess(StaffAccess):
    """Records written by the workers (calls, throttle events): a job's history, looked at and
    never added, edited or deleted one at a time, by superusers neither. A job whose only call
    was deleted still read "1 succeeded, 100 %" with a results file of its header alone.

    They go only with what they belong to: a job's purge (which deletes outside the admin), or
    a user or an API a superuser deletes on that one's own page, which asks this admin whether
    the records it would take along may go."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return deletes_another_model(request, self.opts) and super().has_delete_permission(
            request, obj
        )


def deletes_another_model(request: HttpRequest, opts: Any) -> bool:
    """Whether `request` is another model's deletion (its delete page, or its list's bulk
    delete) rather than one of the pages of `opts`' own admin."""
    match = getattr(request, "resolver_match", None)
    name = (match.url_name or "") if match is not None else ""
    own = f"{opts.app_label}_{opts.model_name}_"
    return name.endswith(("_delete", "_changelist")) and not name.startswith(own)
