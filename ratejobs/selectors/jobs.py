"""Reads on jobs, their calls and throttle events, as a given user may see them."""

from __future__ import annotations

import base64
import codecs
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import Case, Count, F, Q, QuerySet, Sum, Value, When, Window
from django.db.models.functions import Lag, Lead, Length, Trunc
from django.http import Http404
from django.utils import timezone

from ratejobs.models import Call, Job, JobPause, JobSecond, ThrottleEvent
from ratejobs.permissions import sees_every_job
from ratejobs.text import duration_text, moment_text, rate_text

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


# A response's events are written together (services.calls): its 429 or spent quota first,
# then the rate cut it caused, stamped as they were built, well within this of each other.
SAME_RESPONSE_WITHIN = timedelta(seconds=1)
# What a response that stopped the calls writes first; a rate cut right after it is its effect.
RESPONSE_KINDS = (ThrottleEvent.Kind.THROTTLED, ThrottleEvent.Kind.QUOTA_EXHAUSTED)


def _next_to(expression: Any, *, before: bool) -> Window:
    """`expression` on the event written just before (or after) this one for the same call: a
    call is tried once at a time, so its events come in the order of its attempts."""
    function = Lag if before else Lead
    return Window(function(expression), partition_by=[F("call_id")], order_by=F("pk").asc())


# The job page tells the story of a job's newest events: folding them sorts all it reads (the
# count and a page took 0.3 + 0.6 s for 120,000 events, 50 + 45 ms for 10,000, PostgreSQL on a
# 2-core machine); the Throttle events list has them all.
STORY_MAX_EVENTS = 10_000


def throttle_event_story_since(job: Job) -> datetime | None:
    """When the oldest of the job's newest STORY_MAX_EVENTS events was written, if it has more
    (read from the (job, created) index); None when the story holds all of them."""
    newest = ThrottleEvent.objects.filter(job=job).order_by("-created")
    oldest_kept = newest.values_list("created", flat=True)[STORY_MAX_EVENTS - 1 : STORY_MAX_EVENTS]
    return next(iter(oldest_kept), None)


def throttle_event_story_for_job(job: Job) -> QuerySet[ThrottleEvent]:
    """The job's throttle events as an operator reads them, newest first: one row per response
    (a rate cut written for a call right after its 429 or spent quota is folded into that row
    as `cut_before`/`cut_after`), plus the operators' blocks of the job's API while the job
    existed (they stopped its calls too); the newest STORY_MAX_EVENTS of them. The folding is
    one pass of window functions over them (a sort by call), so the pages and the count are
    right whatever the page size. call_indexes() names the calls of a page."""
    since = throttle_event_story_since(job) or job.created
    blocks = Q(api_id=job.api_id, job__isnull=True, kind=ThrottleEvent.Kind.BLOCKED)
    blocks &= Q(created__gte=since)
    if job.finished is not None:
        blocks &= Q(created__lte=job.finished)
    return throttle_event_story(
        ThrottleEvent.objects.filter(Q(job=job, created__gte=since) | blocks)
    )


def throttle_event_story(events: QuerySet[ThrottleEvent]) -> QuerySet[ThrottleEvent]:
    """`events` as an operator reads them, newest first: a rate cut written for a call right
    after its 429 or spent quota is folded into that row (`cut_before`/`cut_after`), so one
    response is one row. One pass of window functions over `events` (a sort by call)."""
    is_cut, is_response = Q(kind=ThrottleEvent.Kind.RATE_DECREASED), Q(kind__in=RESPONSE_KINDS)
    folded = Case(
        When(
            is_cut
            & Q(call_id__isnull=False)
            & Q(previous_kind__in=RESPONSE_KINDS)
            & Q(previous_at__gte=F("created") - SAME_RESPONSE_WITHIN),
            then=Value(True),
        ),
        default=Value(False),
    )
    cut_follows = Q(next_kind=ThrottleEvent.Kind.RATE_DECREASED) & Q(
        next_at__lte=F("created") + SAME_RESPONSE_WITHIN
    )
    return (
        events.annotate(
            previous_kind=_next_to(F("kind"), before=True),
            previous_at=_next_to(F("created"), before=True),
            next_kind=_next_to(F("kind"), before=False),
            next_at=_next_to(F("created"), before=False),
            next_rate_before=_next_to(F("rate_before"), before=False),
            next_rate_after=_next_to(F("rate_after"), before=False),
        )
        .annotate(
            folded=folded,
            cut_before=Case(When(is_response & cut_follows, then=F("next_rate_before"))),
            cut_after=Case(When(is_response & cut_follows, then=F("next_rate_after"))),
        )
        .filter(folded=False)
        .order_by("-created", "-pk")
    )


def call_indexes(events: Iterable[ThrottleEvent]) -> dict[int, int]:
    """The index in its job of each call the events name, by call id (one query)."""
    ids = {event.call_id for event in events if event.call_id is not None}
    return dict(Call.objects.filter(pk__in=ids).values_list("pk", "index")) if ids else {}


# A job's pace is measured over this many seconds of finished calls.
PACE_WINDOW_SECONDS = 60.0


def job_paces(jobs: Iterable[Job]) -> dict[int, float]:
    """Calls/s each running job finished over the last minute (or since it started, if later),
    in one query for the whole page of jobs. Only running jobs have one: a paused job's calls
    still on the wire when it was paused would read as a pace it no longer has."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=PACE_WINDOW_SECONDS)
    windows = {
        job.pk: min(PACE_WINDOW_SECONDS, max((now - job.started).total_seconds(), 1.0))
        for job in jobs
        if job.started is not None and job.status == Job.Status.RUNNING
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


class JobOutcome(NamedTuple):
    """Where a job stands or how it ended: `key` for code and CSS, `label` for people."""

    key: str
    label: str


OUTCOME_LABELS = {
    "queued": "Queued",
    "running": "Running",
    "paused": "Paused",
    "completed": "Completed",
    "completed_with_failures": "Completed with failures",
    "failed": "Failed",
    "cancelled": "Cancelled",
}


def job_outcome(job: Job) -> JobOutcome:
    """The job's status, with a completed one told apart by how its calls ended: "failed" when
    calls failed and none succeeded, "completed_with_failures" when some failed or were not
    sent (cancelled by its deadline), "completed" only when every call succeeded. Every page
    and the REST API show this, so a job never reads as a success it was not."""
    key = str(job.status)
    if job.status == Job.Status.COMPLETED:
        if job.failed and not job.succeeded:
            key = "failed"
        elif job.failed or job.cancelled:
            key = "completed_with_failures"
    return JobOutcome(key, OUTCOME_LABELS[key])


def job_filter_by_outcome(jobs: QuerySet[Job], key: str) -> QuerySet[Job]:
    """The jobs whose job_outcome() has `key`, as one WHERE clause."""
    completed = Q(status=Job.Status.COMPLETED)
    conditions = {
        "completed": completed & Q(failed=0, cancelled=0),
        "completed_with_failures": completed
        & (Q(failed__gt=0, succeeded__gt=0) | Q(failed=0, cancelled__gt=0)),
        "failed": completed & Q(failed__gt=0, succeeded=0),
    }
    return jobs.filter(conditions.get(key, Q(status=key)))


def job_is_final(job: Job) -> bool:
    """Completed or cancelled: nothing more will be dispatched for it."""
    return job.status in (Job.Status.COMPLETED, Job.Status.CANCELLED)


def job_ran(job: Job) -> int:
    """Calls that were sent and ended (succeeded or failed): not those cancelled unsent."""
    return job.succeeded + job.failed


def job_done_text(job: Job) -> str:
    """The calls done, as "120 of 300 (180 cancelled)": calls cancelled before they were sent
    are counted apart, so a cancelled job never reads as all done."""
    text = f"{job_ran(job):,} of {job.total:,}"
    return f"{text} ({job.cancelled:,} cancelled)" if job.cancelled else text


def job_open_pause_started(job: Job) -> datetime | None:
    """When the pause the job is in now began; None when it is not paused, or was paused
    before pauses were recorded (one query, and only for a paused job: lists of finished jobs
    read nothing more)."""
    if job.status != Job.Status.PAUSED:
        return None
    open_pause = JobPause.objects.filter(job_id=job.pk, ended__isnull=True)
    return open_pause.values_list("started", flat=True).first()


def _run_seconds(job: Job) -> tuple[float | None, bool]:
    """The job's duration without its paused time, and whether every pause in it is known (a
    job paused before pauses were recorded has its time in this pause counted as run)."""
    if job.started is None:
        return None, True
    end = job.finished or timezone.now()
    paused = job.paused_seconds
    known = True
    if job.status == Job.Status.PAUSED:
        began = job_open_pause_started(job)
        if began is None:
            known = False
        else:
            paused += max((end - max(began, job.started)).total_seconds(), 0.0)
    return max((end - job.started).total_seconds() - paused, 0.0), known


def job_duration_seconds(job: Job) -> float | None:
    """From start to finish, or to now while it has not finished, less the time it sat paused
    (its ended pauses and the one it is in); None before it starts."""
    return _run_seconds(job)[0]


# A job that ran for less than this (one fast call) is measured over this, not over
# microseconds.
MIN_RATE_SECONDS = 1.0


def job_average_rate(job: Job) -> float | None:
    """Calls sent and ended per second over the job's duration (paused time left out); None
    before it starts, and while it sits in a pause that was not recorded (paused before
    pauses were): its duration then grows with time in which nothing may run."""
    seconds, known = _run_seconds(job)
    if seconds is None or not known:
        return None
    return job_ran(job) / max(seconds, MIN_RATE_SECONDS)


def job_starts_later(job: Job, now: datetime | None = None) -> bool:
    """Nothing of the unfinished job may be sent yet: its not_before is still ahead."""
    if job_is_final(job) or job.not_before is None:
        return False
    return job.not_before > (now or timezone.now())


def job_eta_seconds(job: Job, pace: float, now: datetime | None = None) -> float | None:
    """Seconds until a running job is done at its pace, never faster than its API allows;
    None when there is nothing to estimate from: a queued job has not sent a call (it waits for
    its not_before, a worker or its API's window, none of which says when), a job whose
    not_before is ahead cannot start before it, and a paused, cancelled or completed job is
    not moving by itself."""
    if job.status != Job.Status.RUNNING or job_starts_later(job, now):
        return None
    remaining = job.total - job.done
    if remaining <= 0:
        return 0.0
    limit = job.api.rate / job.api.period
    speed = min(pace, limit) if pace > 0 else limit
    return remaining / speed


def job_pace_text(job: Job, pace: float, average: float | None = None) -> str:
    """The pace as an operator reads it: calls a second lately while the job runs, its average
    over its running time once it is final; "paused" while paused (calls that ended just after
    the pause are not its pace) and "—" before it has started."""
    if job.status == Job.Status.PAUSED:
        return "paused"
    if not job.started or job.status == Job.Status.QUEUED:
        return "—"
    return rate_text(average if job_is_final(job) else pace)


def job_eta_text(job: Job, pace: float, now: datetime | None = None) -> str:
    """The ETA as an operator reads it: a duration only when job_eta_seconds can estimate one;
    otherwise why there is none ("starts at 2030-01-01 09:00:00", "paused"), never "0 s"."""
    if job_is_final(job):
        return "—"
    if job_starts_later(job, now):
        return f"starts at {moment_text(job.not_before)}"
    if job.status == Job.Status.PAUSED:
        return "paused"
    if job.status == Job.Status.QUEUED:
        return "not started: waiting for the window"
    return duration_text(job_eta_seconds(job, pace, now))


@dataclass(frozen=True)
class Timeline:
    """Calls/s and 429s of a job in equal buckets from its start."""

    start: datetime
    bucket_seconds: int
    calls_per_second: list[float]
    throttled: list[int]
    limit_per_second: float


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
