"""Who may do what in ratejobs: one role model, read by the admin, the REST API and the CLI.

| role      | who                                    | APIs              | jobs                 |
|-----------|----------------------------------------|-------------------|----------------------|
| anonymous | not signed in                          | nothing           | nothing              |
| user      | an active account                      | read, no secrets  | submit, see, act: own |
| staff     | `is_staff`: may also use the admin     | read, no secrets  | submit, see, act: own |
| manager   | holds `ratejobs.manage_api` (directly  | create, change,   | submit, see, act: own |
|           | or through a group)                    | block, reset      |                      |
| superuser | `is_superuser`                         | everything        | everyone's           |

"Act" is pause, resume, cancel and retry-failed. Nobody but a superuser sees or touches
another user's jobs, calls (with their response bodies) or throttle events; elsewhere they
are a 404, so their ids stay secret. An API with `submitter_groups` takes jobs only from
members of those groups and from managers; one without takes them from everyone who may sign
in, and calls it with the API's credential on their behalf.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from ratejobs.models import Api

MANAGE_API = "ratejobs.manage_api"


def is_signed_in(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def can_use_admin(user: Any) -> bool:
    return is_signed_in(user) and bool(user.is_staff)


def can_manage_apis(user: Any) -> bool:
    """Create and change APIs: base_url, limits, headers and credentials; block and reset
    their limiters. Superusers, and users holding the `ratejobs.manage_api` permission."""
    return is_signed_in(user) and (bool(user.is_superuser) or user.has_perm(MANAGE_API))


def can_submit_jobs(user: Any) -> bool:
    return is_signed_in(user)


def apis_open_to(user: Any) -> QuerySet[Api]:
    """The APIs `user` may spend the quota and credential of with a job of theirs: those that
    name no submitter groups, and those naming a group of theirs; every API for a manager."""
    if not can_submit_jobs(user):
        return Api.objects.none()
    if can_manage_apis(user):
        return Api.objects.all()
    return Api.objects.filter(
        Q(submitter_groups=None) | Q(submitter_groups__in=user.groups.all())
    ).distinct()


def can_submit_to(user: Any, api: Api) -> bool:
    return apis_open_to(user).filter(pk=api.pk).exists()


def sees_every_job(user: Any) -> bool:
    """Everyone's jobs, calls and throttle events; everyone else sees their own."""
    return is_signed_in(user) and bool(user.is_superuser)


def may_delete_records(user: Any) -> bool:
    """Deleting removes results for good: superusers only."""
    return is_signed_in(user) and bool(user.is_superuser)
