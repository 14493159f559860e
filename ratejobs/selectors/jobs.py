"""Reads on jobs, their calls and throttle events, as a given user may see them."""

from __future__ import annotations

import base64
import codecs
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import Length, Trunc
from django.http import Http404
from django.utils import timezone

from ratejobs.models import Call, Job, JobSecond, ThrottleEvent
from ratejobs.permissions import sees_every_job

# Columns of a call that no listing shows: the request's own body (up to a MiB each) and the
# workers' bookkeeping.
CALL_LIST_DEFERRED = ("json", "body", "response_headers", "claim_token", "claim_owner")


def job_list_for_user(user: Any, status: str | None = None) -> QuerySet[Job]:
    """The jobs the user may see (ratejobs.permissions: their own, everyone's for a
    superuser), newest first; a job being purged is gone already."""
    jobs = Job.objects.filter(purge_started__isnull=True).select_related("api")
    jobs = jobs.order_by("-created", "-pk")
    if not sees_every_job(user):
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
    """The job's calls in index order, without their response bodies (up to a MiB each): each
    has `response_body_bytes`, its body's length, for call_response_bodies to budget."""
    calls = (
        Call.objects.filter(job=job)
        .defer(*CALL_LIST_DEFERRED, "response_body")
        .annotate(response_body_bytes=Length("response_body"))
        .order_by("index")
    )
    if status is not None:
        calls = calls.filter(status=status)
    return calls


def call_response_bodies(calls: Iterable[Call], *, max_bytes: int) -> dict[int, bytes]:
    """The response bodies of calls from call_list_for_job, by call id, in their order while
    their total stays within `max_bytes`; from the first that would pass it on, none (a call
    with a body missing from the result had it left out)."""
    wanted: list[int] = []
    spent = 0
    for call in calls:
        size = call.response_body_bytes
        if size is None:
            continue
        if spent + size > max_bytes:
            break
        spent += size
        wanted.append(call.pk)
    if not wanted:
        return {}
    rows = Call.objects.filter(pk__in=wanted).values_list("pk", "response_body")
    return {pk: bytes(body) for pk, body in rows}


def call_get_for_job(job: Job, index: int) -> Call:
    """One call of the job by its index, with its whole response body; Http404 if none."""
    try:
        return Call.objects.defer(*CALL_LIST_DEFERRED).get(job=job, index=index)
    except Call.DoesNotExist:
        raise Http404("no such call") from None


def throttle_event_list_for_job(job: Job) -> QuerySet[ThrottleEvent]:
    return ThrottleEvent.objects.filter(job=job).order_by("-created", "-pk")


# A job's pace is measured over this many seconds of finished calls.
PACE_WINDOW_SECONDS = 60.0


def job_paces(jobs: Iterable[Job]) -> dict[int, float]:
    """Calls/s each job finished over the last minute (or since it started, if later), in
    one query for the whole page of jobs."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=PACE_WINDOW_SECONDS)
    windows = {
        job.pk: min(PACE_WINDOW_SECONDS, max((now - job.started).total_seconds(), 1.0))
        for job in jobs
        if job.started is not None
    }
    if not windows:
        return {}
    counts = (
        JobSecond.objects.filter(job_id__in=list(windows), at__gte=cutoff)
        .values("job_id")
        .annotate(finished_calls=Sum("calls"))
        .order_by()
    )
    paces = dict.fromkeys(windows, 0.0)
    for row in counts:
        paces[row["job_id"]] = row["finished_calls"] / windows[row["job_id"]]
    return paces


def job_eta_seconds(job: Job, pace: float) -> float | None:
    """Seconds until a running job is done at its pace, never faster than its API allows;
    None when the job is not moving by itself (paused, cancelled, completed)."""
    if job.status not in Job.ACTIVE:
        return None
    remaining = job.total - job.done
    if remaining <= 0:
        return 0.0
    limit = job.api.rate / job.api.period
    speed = min(pace, limit) if pace > 0 else limit
    return remaining / speed


@dataclass(frozen=True)
class Timeline:
    """Calls/s and 429s of a job in equal buckets from its start."""

    start: datetime
    bucket_seconds: int
    calls_per_second: list[float]
    throttled: list[int]
    limit_per_second: float


def duration_text(seconds: float | None) -> str:
    """An ETA or a duration as people read it: 2 h 05 min, 3 min 07 s, 12 s; — for none."""
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {seconds:02d} s"
    return f"{seconds} s"


def job_timeline(job: Job, max_buckets: int = 60) -> Timeline | None:
    """The job's calls/s and 429s over its run, grouped in the database (one row per second,
    minute or hour) and then into at most `max_buckets` buckets; None before it starts."""
    if job.started is None:
        return None
    end = job.finished or timezone.now()
    span = max((end - job.started).total_seconds(), 1.0)
    kind, unit = (
        ("second", 1) if span <= 900 else ("minute", 60) if span <= 54_000 else ("hour", 3600)
    )
    bucket = max(unit, math.ceil(span / max_buckets / unit) * unit)
    start = job.started.replace(microsecond=0)
    if unit >= 60:
        start = start.replace(second=0)
    if unit >= 3600:
        start = start.replace(minute=0)
    buckets = max(1, math.ceil(((end - start).total_seconds() + 1) / bucket))
    calls = [0] * buckets
    throttled = [0] * buckets
    for rows, series in (
        (
            JobSecond.objects.filter(job=job)
            .annotate(bucket_at=Trunc("at", kind))
            .values("bucket_at")
            .annotate(n=Sum("calls")),
            calls,
        ),
        (
            ThrottleEvent.objects.filter(job=job, kind=ThrottleEvent.Kind.THROTTLED)
            .annotate(bucket_at=Trunc("created", kind))
            .values("bucket_at")
            .annotate(n=Count("pk")),
            throttled,
        ),
    ):
        for row in rows.order_by():
            index = int((row["bucket_at"] - start).total_seconds() // bucket)
            series[min(max(index, 0), buckets - 1)] += row["n"]
    return Timeline(
        start=start,
        bucket_seconds=bucket,
        calls_per_second=[n / bucket for n in calls],
        throttled=throttled,
        limit_per_second=job.api.rate / job.api.period,
    )


def failed_call_sample(job: Job, size: int = 10) -> QuerySet[Call]:
    return (
        Call.objects.filter(job=job, status=Call.Status.FAILED)
        .defer("json", "body", "claim_token", "claim_owner")
        .order_by("index")[:size]
    )


def response_body_text(body: bytes | memoryview | None, *, truncated: bool) -> str | None:
    """The stored response body as text if it is UTF-8 (a truncated body may end inside a
    character: that tail is dropped), else None."""
    if body is None:
        return None
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(bytes(body), final=not truncated)
    except UnicodeDecodeError:
        return None


def response_body_output(
    body: bytes | memoryview | None, *, truncated: bool
) -> tuple[str | None, bool]:
    """The body as the REST API and the results files give it, and whether that is base64:
    its text when UTF-8, else base64; (None, False) when there is none."""
    text = response_body_text(body, truncated=truncated)
    if text is None and body is not None:
        return base64.b64encode(body).decode("ascii"), True
    return text, False


def response_removed_text(call: Call) -> str | None:
    """What a page shows instead of a body retention removed (RATEJOBS_KEEP_BODIES_DAYS), so
    that it never reads as a call that got nothing back; None when it was not removed."""
    removed = call.response_removed_at
    if removed is None:
        return None
    days = (removed - (call.finished or removed)).days
    return f"removed after {days} day{'' if days == 1 else 's'} (retention)"


def job_counts_by_status() -> dict[str, int]:
    """How many jobs are in each status (every status present, 0 when none)."""
    counts = dict.fromkeys(Job.Status.values, 0)
    for row in Job.objects.values("status").annotate(n=Count("pk")).order_by():
        counts[row["status"]] = row["n"]
    return counts


def call_counts_by_api() -> dict[int, dict[str, int]]:
    """Calls in each status per API id, from the jobs' counters plus the few calls running now:
    two small queries however many calls the database holds."""
    totals = (
        Job.objects.values("api_id")
        .annotate(
            total=Sum("total"),
            succeeded=Sum("succeeded"),
            failed=Sum("failed"),
            cancelled=Sum("cancelled"),
        )
        .order_by()
    )
    # Running calls are among those handed to the broker (a partial index keeps them few).
    running = dict(
        Call.objects.filter(dispatched_at__isnull=False, status=Call.Status.RUNNING)
        .values_list("job__api_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    counts: dict[int, dict[str, int]] = {}
    for row in totals:
        api_id = row.pop("api_id")
        unfinished = row["total"] - row["succeeded"] - row["failed"] - row["cancelled"]
        now_running = min(running.get(api_id, 0), unfinished)
        counts[api_id] = {
            "pending": unfinished - now_running,
            "running": now_running,
            "succeeded": row["succeeded"],
            "failed": row["failed"],
            "cancelled": row["cancelled"],
        }
    return counts
