"""What the overview page shows: every API's live limiter state and its last five minutes of
traffic, the jobs in progress, and what needs an operator's attention, read in a fixed number
of queries however many APIs and jobs there are."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import (
    Case,
    Count,
    IntegerField,
    Max,
    Q,
    QuerySet,
    Sum,
    When,
)
from django.db.models import Value as V
from django.db.models.functions import Trunc

from ratejobs.infra.clock import database_now
from ratejobs.infra.heartbeats import owner_is_dead
from ratejobs.models import Api, Call, Job, JobSecond, ThrottleEvent, WorkerProcess
from ratejobs.selectors.apis import LimiterReading, api_limiter_readings, api_list
from ratejobs.selectors.job_chart import blocks_holding_until
from ratejobs.selectors.jobs import (
    job_eta_seconds,
    job_eta_text,
    job_list_for_user,
    job_paces,
)

# The sparkline and the "last 5 minutes" figures: 30 buckets of 10 s.
TRAFFIC_SECONDS = 300
TRAFFIC_BUCKET_SECONDS = 10
TRAFFIC_BUCKETS = TRAFFIC_SECONDS // TRAFFIC_BUCKET_SECONDS
# More jobs than this are counted, not listed: the page stays a glance.
JOBS_SHOWN = 50
# Jobs with failed calls are worth a look while they run and for an hour after they finish.
FAILURES_RECENT_SECONDS = 3600
FAILED_JOBS_SHOWN = 10
# A job that just ended stays on the page this long, so its outcome is seen after it leaves
# the jobs in progress.
RECENTLY_FINISHED_SECONDS = 3600
RECENTLY_FINISHED_SHOWN = 20
# Workers write a heartbeat every RATEJOBS_WORKER_HEARTBEAT_SECONDS (5); a minute without one
# while jobs wait is no hiccup.
WORKERS_SEEN_WITHIN_SECONDS = 60
# The workers sweep dead claims every 10 s and the reconciler runs every
# RATEJOBS_RECONCILE_INTERVAL: a call is stuck only once these had their chance to fix it.
STUCK_MARGIN_SECONDS = 30
# Running first, then those waiting to run, then those an operator holds.
IN_PROGRESS = (Job.Status.RUNNING, Job.Status.QUEUED, Job.Status.PAUSED)


@dataclass(frozen=True)
class ApiTraffic:
    """An API's calls in the last TRAFFIC_SECONDS, in TRAFFIC_BUCKET_SECONDS buckets, oldest
    first: calls that ended (succeeded or failed) and 429s received."""

    finished: tuple[int, ...]
    throttled: tuple[int, ...]

    @property
    def throttles(self) -> int:
        return sum(self.throttled)

    @property
    def finished_calls(self) -> int:
        """Calls that ended (succeeded or failed): a call's 429s are attempts of it, not calls."""
        return sum(self.finished)

    @property
    def sent(self) -> int:
        """Requests the API answered: calls that ended, and 429s (each one was sent too)."""
        return self.finished_calls + self.throttles

    @property
    def calls_per_second(self) -> list[float]:
        return [n / TRAFFIC_BUCKET_SECONDS for n in self.finished]


@dataclass(frozen=True)
class ApiOverview:
    api: Api
    reading: LimiterReading
    traffic: ApiTraffic
    # The newest 429, quota block or manual block of a blocked API: why it is blocked.
    block_reason: ThrottleEvent | None

    @property
    def blocked_for(self) -> float:
        state = self.reading.state
        return 0.0 if state is None else state.blocked_for


@dataclass(frozen=True)
class JobOverview:
    job: Job
    pace: float  # calls/s over the last minute; 0 unless running
    eta_seconds: float | None
    eta_text: str  # the ETA, or why there is none ("starts at …", "paused")


@dataclass(frozen=True)
class StuckCalls:
    """An API's calls that nothing is moving: running past their claim or on a process that
    stopped sending heartbeats, and in the broker so long the reconciler should have sent
    them again (is beat running?)."""

    api_name: str
    running: int
    not_started: int


@dataclass(frozen=True)
class Overview:
    now: datetime  # the database's clock when it was read
    apis: list[ApiOverview]
    jobs: list[JobOverview]
    jobs_not_shown: int
    failed_jobs: list[Job]
    failed_jobs_not_shown: int
    finished_jobs: list[Job]  # ended within RECENTLY_FINISHED_SECONDS, newest first
    finished_jobs_not_shown: int
    stuck: list[StuckCalls]
    workers_last_seen: datetime | None
    workers_missing: bool  # jobs wait to run and no worker was seen for a minute

    @property
    def blocked_apis(self) -> list[ApiOverview]:
        return [item for item in self.apis if item.blocked_for > 0]


def overview_for_user(user: Any) -> Overview:
    """The overview as `user` may see it: every API (staff read them all), and their own jobs
    and calls unless they see every job (ratejobs.permissions)."""
    now = database_now()
    apis = list(api_list())
    readings = api_limiter_readings(apis)
    traffic = _traffic_by_api(now)
    reasons = blocks_holding_until({
        api.pk: now + timedelta(seconds=state.blocked_for)
        for api in apis
        if (state := readings[api.pk].state) is not None and state.blocked_for > 0
    })  # fmt: skip
    visible_jobs = job_list_for_user(user)
    jobs, jobs_not_shown = _jobs_in_progress(visible_jobs)
    failed_jobs, failed_not_shown = _jobs_with_failures(visible_jobs, now)
    finished_jobs, finished_not_shown = _jobs_recently_finished(visible_jobs, now)
    workers_last_seen = WorkerProcess.objects.aggregate(last=Max("seen_at"))["last"]
    active = bool(jobs) and jobs[0].job.status in Job.ACTIVE  # running and queued come first
    workers_gone = workers_last_seen is None or workers_last_seen < now - timedelta(
        seconds=WORKERS_SEEN_WITHIN_SECONDS
    )
    return Overview(
        now=now,
        apis=[
            ApiOverview(
                api=api,
                reading=readings[api.pk],
                traffic=traffic.get(api.pk, _NO_TRAFFIC),
                block_reason=reasons.get(api.pk),
            )
            for api in apis
        ],
        jobs=jobs,
        jobs_not_shown=jobs_not_shown,
        failed_jobs=failed_jobs,
        failed_jobs_not_shown=failed_not_shown,
        finished_jobs=finished_jobs,
        finished_jobs_not_shown=finished_not_shown,
        stuck=_stuck_calls(visible_jobs, now),
        workers_last_seen=workers_last_seen,
        workers_missing=active and workers_gone,
    )


_NO_TRAFFIC = ApiTraffic(finished=(0,) * TRAFFIC_BUCKETS, throttled=(0,) * TRAFFIC_BUCKETS)


def _traffic_by_api(now: datetime) -> dict[int, ApiTraffic]:
    """Two grouped queries for every API at once. JobSecond has no index on its time alone,
    so it is reached through the jobs that can have counted a call lately (in progress, or
    finished within the window: few), each by its (job, at) unique index."""
    since = now - timedelta(seconds=TRAFFIC_SECONDS)
    recent_jobs = Job.objects.filter(Q(status__in=IN_PROGRESS) | Q(finished__gte=since))
    finished_rows = (
        JobSecond.objects.filter(job__in=recent_jobs.values("pk"), at__gte=since)
        .values("job__api_id", "at")
        .annotate(n=Sum("calls"))
        .order_by()
    )
    throttled_rows = (
        ThrottleEvent.objects.filter(kind=ThrottleEvent.Kind.THROTTLED, created__gte=since)
        .annotate(second=Trunc("created", "second"))
        .values("api_id", "second")
        .annotate(n=Count("pk"))
        .order_by()
    )
    finished: dict[int, list[int]] = defaultdict(lambda: [0] * TRAFFIC_BUCKETS)
    throttled: dict[int, list[int]] = defaultdict(lambda: [0] * TRAFFIC_BUCKETS)
    for row in finished_rows:
        finished[row["job__api_id"]][_bucket(row["at"], since)] += row["n"]
    for row in throttled_rows:
        throttled[row["api_id"]][_bucket(row["second"], since)] += row["n"]
    return {
        api_id: ApiTraffic(
            finished=tuple(finished.get(api_id, _NO_TRAFFIC.finished)),
            throttled=tuple(throttled.get(api_id, _NO_TRAFFIC.throttled)),
        )
        for api_id in set(finished) | set(throttled)
    }


def _bucket(moment: datetime, since: datetime) -> int:
    index = int((moment - since).total_seconds() // TRAFFIC_BUCKET_SECONDS)
    return min(max(index, 0), TRAFFIC_BUCKETS - 1)


def _jobs_in_progress(visible_jobs: QuerySet[Job]) -> tuple[list[JobOverview], int]:
    order = Case(
        *(When(status=status, then=V(rank)) for rank, status in enumerate(IN_PROGRESS)),
        output_field=IntegerField(),
    )
    in_progress = visible_jobs.filter(status__in=IN_PROGRESS)
    jobs = list(
        in_progress.annotate(rank=order).order_by("rank", "-created", "-pk")[: JOBS_SHOWN + 1]
    )
    not_shown = in_progress.count() - JOBS_SHOWN if len(jobs) > JOBS_SHOWN else 0
    jobs = jobs[:JOBS_SHOWN]
    paces = job_paces(jobs)
    return [
        JobOverview(
            job=job,
            pace=(pace := paces.get(job.pk, 0.0)),
            eta_seconds=job_eta_seconds(job, pace),
            eta_text=job_eta_text(job, pace),
        )
        for job in jobs
    ], not_shown


def _jobs_recently_finished(visible_jobs: QuerySet[Job], now: datetime) -> tuple[list[Job], int]:
    since = now - timedelta(seconds=RECENTLY_FINISHED_SECONDS)
    finished = visible_jobs.filter(
        status__in=(Job.Status.COMPLETED, Job.Status.CANCELLED), finished__gte=since
    ).order_by("-finished", "-pk")
    jobs = list(finished[: RECENTLY_FINISHED_SHOWN + 1])
    not_shown = (
        finished.count() - RECENTLY_FINISHED_SHOWN if len(jobs) > RECENTLY_FINISHED_SHOWN else 0
    )
    return jobs[:RECENTLY_FINISHED_SHOWN], not_shown


def _jobs_with_failures(visible_jobs: QuerySet[Job], now: datetime) -> tuple[list[Job], int]:
    recent = now - timedelta(seconds=FAILURES_RECENT_SECONDS)
    failing = visible_jobs.filter(failed__gt=0).filter(
        Q(status__in=IN_PROGRESS) | Q(finished__gte=recent)
    )
    jobs = list(failing[: FAILED_JOBS_SHOWN + 1])
    not_shown = failing.count() - FAILED_JOBS_SHOWN if len(jobs) > FAILED_JOBS_SHOWN else 0
    return jobs[:FAILED_JOBS_SHOWN], not_shown


def _stuck_calls(visible_jobs: QuerySet[Job], now: datetime) -> list[StuckCalls]:
    """Two grouped queries, each on a partial index of Call: running calls (call_running_owner)
    and calls in the broker (call_dispatched)."""
    margin = timedelta(seconds=STUCK_MARGIN_SECONDS)
    calls = Call.objects.filter(job__in=visible_jobs.values("pk"))
    running = (
        calls.filter(status=Call.Status.RUNNING)
        .filter(Q(running_until__lt=now - margin) | owner_is_dead(now - margin))
        .values("job__api__name")
        .annotate(n=Count("pk"))
        .order_by()
    )
    # The reconciler sends again calls dispatched RATEJOBS_STALE_DISPATCH_SECONDS ago, every
    # RATEJOBS_RECONCILE_INTERVAL: older ones mean it does not run.
    stale = timedelta(
        seconds=settings.RATEJOBS_STALE_DISPATCH_SECONDS + settings.RATEJOBS_RECONCILE_INTERVAL
    )
    not_started = (
        calls.filter(status=Call.Status.PENDING, dispatched_at__lt=now - stale - margin)
        .values("job__api__name")
        .annotate(n=Count("pk"))
        .order_by()
    )
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in running:
        counts[row["job__api__name"]][0] += row["n"]
    for row in not_started:
        counts[row["job__api__name"]][1] += row["n"]
    return [
        StuckCalls(api_name=name, running=pair[0], not_started=pair[1])
        for name, pair in sorted(counts.items())
    ]
