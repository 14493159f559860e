"""Feeding the broker from the database: a bounded window of messages per API, shared fairly
between that API's running jobs, and a reconciler for messages that were lost."""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import F, Min, Q
from django.utils import timezone

from ratejobs.models import Api, Call, Job
from ratejobs.services.apis import redis_client

logger = logging.getLogger(__name__)

# Completions within this long share one dispatch run: the window holds seconds of work, so a
# quarter second of delay costs nothing and saves a dispatch query per call.
DISPATCH_DEBOUNCE_SECONDS = 0.25
# Calls waiting for a later attempt are looked at again at least this often. Countdowns stay
# short: a Redis broker redelivers a long-delayed task after its visibility timeout.
MAX_WAKEUP_SECONDS = 5.0


@dataclass(frozen=True)
class DispatchResult:
    dispatched: int
    next_due: datetime | None  # the earliest later attempt still waiting, if any


def dispatch_window(api: Api) -> int:
    per_second = api.rate / api.period
    wanted = math.ceil(per_second * settings.RATEJOBS_DISPATCH_WINDOW_SECONDS)
    return max(
        settings.RATEJOBS_DISPATCH_WINDOW_MIN, min(settings.RATEJOBS_DISPATCH_WINDOW_MAX, wanted)
    )


def dispatch_api(*, api_id: int) -> DispatchResult:
    """Top up the API's window of broker messages with due calls of its running jobs."""
    now = timezone.now()
    with transaction.atomic():
        # Serialise the dispatchers of one API: a row lock on PostgreSQL, the write lock on
        # SQLite. Without it two could both see free room and overfill the window.
        if not Api.objects.filter(pk=api_id).update(updated=F("updated")):
            return DispatchResult(0, None)
        api = Api.objects.get(pk=api_id)
        in_window = Call.objects.filter(job__api_id=api_id, dispatched_at__isnull=False).count()
        free = dispatch_window(api) - in_window
        if free <= 0:  # the common case while a job runs: no job row is locked for nothing
            return DispatchResult(0, None)
        # Lock the jobs before their calls, in id order, as pause, cancel and recording an
        # outcome do (job first): marking calls first and then updating their job deadlocked
        # with a pause. After waiting on a lock, a job paused meanwhile drops out here.
        jobs = sorted(
            Job.objects.select_for_update()
            .filter(api_id=api_id, status__in=Job.ACTIVE)
            .order_by("pk"),
            key=lambda job: (job.dispatch_pass, job.pk),
        )
        if not jobs:
            return DispatchResult(0, None)
        due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
        candidates = {
            job.pk: deque(
                job.calls.filter(due, status=Call.Status.PENDING, dispatched_at__isnull=True)
                .order_by("index")
                .values_list("pk", flat=True)[:free]
            )
            for job in jobs
        }
        chosen = _share_fairly(jobs, candidates, free)
        call_ids = [call_id for ids in chosen.values() for call_id in ids]
        if call_ids:
            Call.objects.filter(
                pk__in=call_ids, status=Call.Status.PENDING, dispatched_at__isnull=True
            ).update(dispatched_at=now)
            for job in jobs:
                if chosen.get(job.pk):
                    Job.objects.filter(pk=job.pk).update(dispatch_pass=job.dispatch_pass)
            Job.objects.filter(pk__in=list(chosen), status=Job.Status.QUEUED).update(
                status=Job.Status.RUNNING, started=now
            )
            messages = [(call_id, job_id) for job_id, ids in chosen.items() for call_id in ids]
            transaction.on_commit(lambda: _send(messages))
        next_due = None
        if len(call_ids) < free:
            next_due = Call.objects.filter(
                job__in=jobs,
                status=Call.Status.PENDING,
                dispatched_at__isnull=True,
                next_attempt_at__gt=now,
            ).aggregate(first=Min("next_attempt_at"))["first"]
    return DispatchResult(len(call_ids), next_due)


def _share_fairly(
    jobs: list[Job], candidates: dict[int, deque[int]], free: int
) -> dict[int, list[int]]:
    """Stride scheduling: the job with the lowest pass takes the next place and advances its
    pass by 1/priority, so over time each job gets places in proportion to its priority."""
    heap = [(job.dispatch_pass, job.pk, job) for job in jobs if candidates[job.pk]]
    heapq.heapify(heap)
    chosen: dict[int, list[int]] = {}
    while free and heap:
        _, _, job = heapq.heappop(heap)
        chosen.setdefault(job.pk, []).append(candidates[job.pk].popleft())
        job.dispatch_pass += 1.0 / job.priority
        free -= 1
        if candidates[job.pk]:
            heapq.heappush(heap, (job.dispatch_pass, job.pk, job))
    return chosen


def _send(messages: list[tuple[int, int]]) -> None:
    from ratejobs.tasks import execute_call

    try:
        for call_id, job_id in messages:
            # argsrepr is what Flower and the worker log show for the task
            execute_call.apply_async(
                args=[call_id, job_id], argsrepr=f"(call={call_id}, job={job_id})"
            )
    except Exception:  # broker down: the reconciler re-dispatches what was marked but not sent
        logger.exception("could not send %d call messages to the broker", len(messages))


def request_dispatch(api_id: int) -> None:
    """Ask for a dispatch run of the API soon; calls close together share one run."""
    from ratejobs.tasks import dispatch

    try:
        first = redis_client().set(
            f"ratejobs:dispatch:{{{api_id}}}:pending",
            1,
            nx=True,
            px=int(DISPATCH_DEBOUNCE_SECONDS * 1000),
        )
        if first:
            dispatch.apply_async(args=[api_id], countdown=DISPATCH_DEBOUNCE_SECONDS)
    except (redis.RedisError, OSError):
        logger.warning("Redis unreachable: dispatch of API %s left to the reconciler", api_id)
    except Exception:  # the broker (also Redis by default) refused the message
        logger.exception("could not request a dispatch of API %s", api_id)


def schedule_wakeup(api_id: int, next_due: datetime | None) -> None:
    """Dispatch again when the earliest waiting call is due (in steps of at most a few s)."""
    if next_due is None:
        return
    from ratejobs.tasks import dispatch

    delay = min(max((next_due - timezone.now()).total_seconds(), 0.05), MAX_WAKEUP_SECONDS)
    try:
        if redis_client().set(
            f"ratejobs:dispatch:{{{api_id}}}:wakeup", 1, nx=True, px=int(delay * 1000)
        ):
            dispatch.apply_async(args=[api_id], countdown=delay)
    except Exception:
        logger.warning("could not schedule a wake-up of API %s; the reconciler will", api_id)


@dataclass(frozen=True)
class ReconcileResult:
    redispatched: int  # in the broker too long: their message was lost
    recovered: int  # running on a worker that died
    cancelled: int  # recovered, but their job had been cancelled meanwhile
    completed_jobs: int
    apis: int


def reconcile() -> ReconcileResult:
    """Safety net run by celery beat: give calls whose broker message or worker was lost back
    to the dispatcher, finish jobs whose calls are all final, and top up every window.

    A call running on a process that died is recovered at once when that process was on this
    host, else when its claim expires."""
    from ratejobs.services.calls import claim_owner_is_dead
    from ratejobs.services.jobs import job_cancel_leftovers, job_complete_if_done

    now = timezone.now()
    stale = now - timedelta(seconds=settings.RATEJOBS_STALE_DISPATCH_SECONDS)
    redispatched = Call.objects.filter(status=Call.Status.PENDING, dispatched_at__lt=stale).update(
        dispatched_at=None
    )
    orphans = Q(running_until__lt=now) | Q(
        pk__in=[
            pk
            for pk, owner in Call.objects.filter(status=Call.Status.RUNNING).values_list(
                "pk", "claim_owner"
            )
            if claim_owner_is_dead(owner)
        ]
    )
    recovered = Call.objects.filter(orphans, status=Call.Status.RUNNING).update(
        status=Call.Status.PENDING,
        dispatched_at=None,
        claim_token="",
        claim_owner="",
        running_until=None,
    )
    leftovers = job_cancel_leftovers()
    completed = sum(
        job_complete_if_done(job_id=job_id)
        for job_id in Job.objects.filter(status=Job.Status.RUNNING).values_list("pk", flat=True)
    )
    api_ids = set(
        Job.objects.filter(status__in=Job.ACTIVE).values_list("api_id", flat=True).distinct()
    )
    for api_id in api_ids:
        schedule_wakeup(api_id, dispatch_api(api_id=api_id).next_due)
    if redispatched or recovered or leftovers:
        logger.info(
            "reconciler: %d calls re-dispatched, %d recovered from dead workers, "
            "%d left in cancelled jobs cancelled",
            redispatched,
            recovered,
            leftovers,
        )
    return ReconcileResult(redispatched, recovered, leftovers, completed, len(api_ids))
