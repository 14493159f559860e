"""Reads on jobs, their calls and throttle events, as a given user may see them."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404

from ratejobs.models import Call, Job, ThrottleEvent

# Columns of a call that no listing shows: the request's own body (up to a MiB each) and the
# workers' bookkeeping.
CALL_LIST_DEFERRED = ("json", "body", "response_headers", "claim_token", "claim_owner")


def job_list_for_user(user: Any, status: str | None = None) -> QuerySet[Job]:
    """The user's jobs (every job for staff), newest first."""
    jobs = Job.objects.select_related("api").order_by("-created", "-pk")
    if not user.is_staff:
        jobs = jobs.filter(owner=user)
    if status is not None:
        jobs = jobs.filter(status=status)
    return jobs


def job_get_for_user(user: Any, id: int) -> Job:
    """The job if the user may see it; Http404 otherwise, so others' job ids stay secret."""
    try:
        return job_list_for_user(user).get(pk=id)
    except Job.DoesNotExist:
        raise Http404("no such job") from None


def job_get_by_idempotency_key(*, owner: Any, key: str) -> Job | None:
    return Job.objects.select_related("api").filter(owner=owner, idempotency_key=key).first()


def call_list_for_job(job: Job, status: str | None = None) -> QuerySet[Call]:
    calls = Call.objects.filter(job=job).defer(*CALL_LIST_DEFERRED).order_by("index")
    if status is not None:
        calls = calls.filter(status=status)
    return calls


def throttle_event_list_for_job(job: Job) -> QuerySet[ThrottleEvent]:
    return ThrottleEvent.objects.filter(job=job).order_by("-created", "-pk")
