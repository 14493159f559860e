"""Feeding the broker from the database: a bounded window of calls waiting in the broker per
API, shared fairly between that API's running jobs, sent as messages of several calls each.

Messages go out by task name (celery's send_task), so this module needs nothing of the tasks
that run them: the way reads top to bottom, job_create -> dispatch -> broker -> task ->
services.calls -> dispatch again."""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F, Min, Q, Sum, Value
from django.db.models.functions import Coalesce, NullIf

from ratejobs.celery_settings import EXECUTE_CALLS_TASK
from ratejobs.infra.clock import database_now
from ratejobs.infra.limiters import api_limiter
from ratejobs.limiter import LimiterError
from ratejobs.models import Api, ApiCredential, Call, Job, JobSecond

logger = logging.getLogger(__name__)

# What an API with an in-flight cap carried lately is read over this span of JobSecond rows
# (whole seconds: the newest is still filling).
CAPPED_PACE_SECONDS = 3
# The shortest time a capped API's recent pace is measured over: one batch of outcomes.
CAPPED_RAMP_SECONDS = 0.25
# When the limiter's bookings fill a worker's wait, dispatch looks again after at least this.
BOOKED_RECHECK_SECONDS = 0.25


@dataclass(frozen=True)
class DispatchResult:
    dispatched: int
    next_due: datetime | None  # the earliest later attempt still waiting, if any


@dataclass(frozen=True)
class LimiterPace:
    """What the API's own limiter grants now, as far as dispatch cares."""

    per_second: float  # requests a second it grants (an adaptive API's cut rate)
    blocked_for: float  # seconds until it grants anything (a 429's Retry-After), 0 if none
    booked_for: float  # seconds of slots already granted ahead: the limiter, not calls, binds


def limiter_pace(api: Api) -> LimiterPace:
    """The pace the window is sized by: the API's rate, or, for an adaptive API, the rate its
    limiter has cut to, and how long a block still stops it. Sized by an adaptive API's
    ceiling, a window held at a sixth of it (make demo) sent each call out 7.5 times: every
    slot beyond the worker's wait came back at once, a message and a dispatch run each, two
    thirds of what Flower listed. The ceiling and no block when Redis cannot be read: the
    limiter still bounds the pace."""
    ceiling = api.rate / api.period
    try:
        state = api_limiter(api).state()
    except LimiterError:
        return LimiterPace(ceiling, 0.0, 0.0)
    if not state.configured or state.period <= 0:
        return LimiterPace(ceiling, 0.0, 0.0)
    per_second = ceiling
    if api.adaptive and state.current_rate > 0:
        per_second = min(ceiling, state.current_rate / state.period)
    return LimiterPace(per_second, state.blocked_for, state.next_free_in)


def dispatch_window(api: Api, *, buckets: int = 1, per_second: float | None = None) -> int:
    """Calls the broker may hold for `api`: RATEJOBS_DISPATCH_WINDOW_SECONDS of its work at
    `per_second` (its rate unless given), where `buckets` credential keys each run at it."""
    if per_second is None:
        per_second = api.rate / api.period
    wanted = math.ceil(per_second * buckets * settings.RATEJOBS_DISPATCH_WINDOW_SECONDS)
    return max(
        settings.RATEJOBS_DISPATCH_WINDOW_MIN, min(settings.RATEJOBS_DISPATCH_WINDOW_MAX, wanted)
    )


def _credential_buckets_running(api_id: int, *, has_credentials: bool) -> int:
    """How many limiter buckets the API's running calls use (its own, and one per credential
    key), at least 1: calls spread over K keys go K times the API's rate, and a window of one
    rate's work would leave the broker empty between dispatch runs. Counted over the running
    calls (few, and indexed), only for an API that `has_credentials`: dispatch_api has asked
    that already, before taking the API's lock, and a run asks the database once."""
    if not has_credentials:
        return 1
    running = (
        Call.objects.filter(job__api_id=api_id, status=Call.Status.RUNNING)
        .annotate(key=Coalesce(NullIf("credential_key", Value("")), "job__credential_key"))
        .values("key")
        .distinct()
        .count()
    )
    return max(1, running)


def capped_window(api: Api, now: datetime) -> int:
    """Calls of an API with an in-flight cap that may be running or waiting in the broker:
    what its places carried in the last CAPPED_PACE_SECONDS, over twice a worker's wait for a
    place, and never fewer than twice the cap. A call waits in its worker for a released place
    and gives up after RATEJOBS_MAX_WORKER_WAIT, so more than the places carry in that time
    would only come back; fewer leaves places idle while the outcomes are recorded and the
    next calls dispatched (twice the cap carried 117 calls/s in bench-jobs where the places
    carry thousands)."""
    cap = api.max_concurrency
    recent = JobSecond.objects.filter(
        job__api_id=api.pk,
        job__status__in=Job.ACTIVE,
        at__gte=now - timedelta(seconds=CAPPED_PACE_SECONDS),
    ).aggregate(calls=Sum("calls"), since=Min("at"), started=Min("job__started"))
    if not recent["calls"]:
        return 2 * cap
    # Over the seconds the rows cover or, when the jobs started within them, since their start
    # (none of their calls ended before it): counted over at least a whole second, a new job's
    # first calls looked up to four times slower than they were, and its first second
    # carried 40 % of the API's rate at a cap of 16 (bench-fleet).
    started = recent["started"]
    if started is not None and started > now - timedelta(seconds=CAPPED_PACE_SECONDS):
        seconds = max(CAPPED_RAMP_SECONDS, (now - started).total_seconds())
    else:
        seconds = min(CAPPED_PACE_SECONDS, max(1.0, (now - recent["since"]).total_seconds()))
    carried = recent["calls"] / seconds * settings.RATEJOBS_MAX_WORKER_WAIT
    return max(2 * cap, math.ceil(2 * carried))


def slots_within_wait(api: Api, *, buckets: int = 1, per_second: float | None = None) -> int:
    """Slots the API's limiter grants within RATEJOBS_MAX_WORKER_WAIT (each of `buckets`
    credential keys at `per_second`, the API's rate unless given)."""
    if per_second is None:
        per_second = api.rate / api.period
    return math.ceil(per_second * buckets * settings.RATEJOBS_MAX_WORKER_WAIT)


def calls_per_message(api: Api, *, per_second: float | None = None) -> int:
    """Calls one message carries: at most RATEJOBS_CALLS_PER_MESSAGE, and no more than the
    limiter grants in one worker wait (at `per_second`, the API's rate unless given), so one
    process does not take calls it must park."""
    if per_second is None:
        per_second = api.rate / api.period
    per_wait = math.ceil(per_second * settings.RATEJOBS_MAX_WORKER_WAIT)
    return max(1, min(settings.RATEJOBS_CALLS_PER_MESSAGE, per_wait))


def dispatch_api(*, api_id: int, dispatcher: str = "") -> DispatchResult:
    """Top up the API's window of calls waiting in the broker with due calls of its running
    jobs. Calls already running count only beyond what the limiter grants within a worker's
    wait (under an in-flight cap, see capped_window): the limiter bounds the others.

    `dispatcher` is the worker process running this (its heartbeat's owner), or "" (beat's
    reconciler). The calls it marks name it: marked in one transaction and sent after its
    commit, their messages are lost if the process dies in between, and the sweep gives back
    the calls a dead dispatcher left in the window (reconcile.calls_recover_orphans) instead of
    leaving them to the reconciler's RATEJOBS_STALE_DISPATCH_SECONDS."""
    now = database_now()
    api = Api.objects.filter(pk=api_id).first()
    if api is None:
        return DispatchResult(0, None)
    # Asked once a run, here: the window's buckets below go by the same answer as the pace,
    # and a credential added meanwhile counts from the next run.
    has_credentials = ApiCredential.objects.filter(api_id=api_id).exists()
    # Read before the API's row is locked (Redis may be slow to answer). Each credential key
    # has a bucket of its own, with its own cut rate and blocks: the API's says nothing of them.
    pace = None if has_credentials else limiter_pace(api)
    if pace is not None and pace.blocked_for > settings.RATEJOBS_MAX_WORKER_WAIT:
        # Every call sent now would find its slot after the block and come straight back.
        return DispatchResult(0, now + timedelta(seconds=pace.blocked_for))
    per_second = None if pace is None else pace.per_second
    with transaction.atomic():
        # Serialise the dispatchers of one API: a row lock on PostgreSQL, the write lock on
        # SQLite. Without it two could both see free room and overfill the window.
        if not Api.objects.filter(pk=api_id).update(updated=F("updated")):
            return DispatchResult(0, None)
        api = Api.objects.get(pk=api_id)
        in_window = Call.objects.filter(
            job__api_id=api_id, status=Call.Status.PENDING, dispatched_at__isnull=False
        ).count()
        buckets = _credential_buckets_running(api_id, has_credentials=has_credentials)
        free = dispatch_window(api, buckets=buckets, per_second=per_second) - in_window
        running = Call.objects.filter(job__api_id=api_id, status=Call.Status.RUNNING).count()
        if api.max_concurrency:
            free = min(free, capped_window(api, now) - running - in_window)
        else:
            # Running calls beyond what the limiter grants within a worker's wait only come
            # back (their slot is further): they take the window's room, as if in the broker.
            within_wait = slots_within_wait(api, buckets=buckets, per_second=per_second)
            free -= max(0, running - within_wait)
        due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
        # Calls without a kept place that may go: all of `free` unless the limiter binds.
        fresh = free
        if pace is not None and pace.booked_for > 0 and not (api.max_concurrency or api.limits):
            # Its slots are booked that far ahead, and a call claimed now starts only after
            # them: more than tops the bookings up to a worker's wait would come straight back
            # (3.6 claims a call in make demo, a message's worth sent at every run). Calls
            # coming back to a kept place go all the same: their slot is among the bookings.
            # Only where the main rate alone binds: a window's bookings are in its own units
            # (a cost of 190 books as much as 38 calls of 5), and counted as calls they held
            # back the call that must first try, then keep, its place (test_keep_place).
            wait_left = settings.RATEJOBS_MAX_WORKER_WAIT - pace.booked_for
            fresh = min(free, math.ceil(per_second * max(0.0, wait_left)) - in_window)
            if free > 0 and fresh <= 0 and not _kept_places_due(api_id, due):
                # Calls finishing ask again; the bookings may be another program's.
                later = max(BOOKED_RECHECK_SECONDS, -wait_left)
                return DispatchResult(0, now + timedelta(seconds=later))
        if free <= 0:  # the common case while a job runs: no job row is locked for nothing
            return DispatchResult(0, None)
        # Lock the jobs before their calls, in id order, as pause, cancel and recording an
        # outcome do (job first): marking calls first and then updating their job deadlocked
        # with a pause. After waiting on a lock, a job paused meanwhile drops out here.
        jobs = sorted(
            Job.objects.select_for_update()
            .filter(api_id=api_id, status__in=Job.ACTIVE)
            .filter(Q(not_before__isnull=True) | Q(not_before__lte=now))
            .filter(Q(deadline__isnull=True) | Q(deadline__gt=now))
            .order_by("pk"),
            key=lambda job: (job.dispatch_pass, job.pk),
        )
        if not jobs:
            return DispatchResult(0, _next_start(api_id, now))
        candidates = {job.pk: _candidates(job, due, free) for job in jobs}
        chosen = _share_fairly(jobs, candidates, free, fresh=max(0, fresh))
        call_ids = [call_id for ids in chosen.values() for call_id in ids]
        if call_ids:
            Call.objects.filter(
                pk__in=call_ids, status=Call.Status.PENDING, dispatched_at__isnull=True
            ).update(dispatched_at=now, claim_owner=dispatcher)
            for job in jobs:
                if chosen.get(job.pk):
                    Job.objects.filter(pk=job.pk).update(dispatch_pass=job.dispatch_pass)
            Job.objects.filter(pk__in=list(chosen), status=Job.Status.QUEUED).update(
                status=Job.Status.RUNNING
            )
            # also a job paused before its first dispatch and resumed (running, never started)
            Job.objects.filter(pk__in=list(chosen), started__isnull=True).update(started=now)
            size = calls_per_message(api, per_second=per_second)
            messages = [
                (job_id, ids[start : start + size])
                for job_id, ids in chosen.items()
                for start in range(0, len(ids), size)
            ]
            transaction.on_commit(lambda: _send(messages))
        next_due = None
        if len(call_ids) < free:
            next_due = Call.objects.filter(
                job__in=jobs,
                status=Call.Status.PENDING,
                dispatched_at__isnull=True,
                next_attempt_at__gt=now,
            ).aggregate(first=Min("next_attempt_at"))["first"]
    starts = _next_start(api_id, now)
    if starts is not None and (next_due is None or starts < next_due):
        next_due = starts
    return DispatchResult(len(call_ids), next_due)


class Candidates(NamedTuple):
    """A job's due calls in the order they should go, and how many at the front come back to
    confirm a kept limiter place."""

    calls: deque[int]
    kept: int


def _candidates(job: Job, due: Q, free: int) -> Candidates:
    """Up to `free` of the job's due calls waiting in the database, in the order they should
    go: first those coming back to confirm a kept limiter place (its slot is near and passes
    unused if they are late), then the others by index."""
    waiting = job.calls.filter(due, status=Call.Status.PENDING, dispatched_at__isnull=True)
    kept = list(
        waiting.filter(reservation__isnull=False)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:free]
    )
    others = waiting.order_by("index").values_list("pk", flat=True)[: free + len(kept)]
    first = set(kept)
    return Candidates(deque((kept + [pk for pk in others if pk not in first])[:free]), len(kept))


def _kept_places_due(api_id: int, due: Q) -> bool:
    """Whether a call of the API waits in the database to confirm a kept place now."""
    return Call.objects.filter(
        due,
        job__api_id=api_id,
        status=Call.Status.PENDING,
        dispatched_at__isnull=True,
        reservation__isnull=False,
    ).exists()


def _next_start(api_id: int, now: datetime) -> datetime | None:
    """When the API's next job that waits for its not_before may start, if that is within a
    reconciler's run: wake-ups come every few seconds at most, and a job starting in an hour
    is the reconciler's to find, not a chain of wake-ups'."""
    soon = now + timedelta(seconds=settings.RATEJOBS_RECONCILE_INTERVAL)
    return Job.objects.filter(
        api_id=api_id, status__in=Job.ACTIVE, not_before__gt=now, not_before__lte=soon
    ).aggregate(first=Min("not_before"))["first"]


def _share_fairly(
    jobs: list[Job], candidates: dict[int, Candidates], free: int, *, fresh: int
) -> dict[int, list[int]]:
    """Stride scheduling: the job with the lowest pass takes the next place and advances its
    pass by 1/priority, so over time each job gets places in proportion to its priority. Of
    the `free` places, at most `fresh` go to calls without a kept place."""
    left = {job.pk: candidates[job.pk].kept for job in jobs}
    heap = [(job.dispatch_pass, job.pk, job) for job in jobs if candidates[job.pk].calls]
    heapq.heapify(heap)
    chosen: dict[int, list[int]] = {}
    while free and heap:
        _, _, job = heapq.heappop(heap)
        if left[job.pk]:
            left[job.pk] -= 1
        elif fresh:
            fresh -= 1
        else:  # the job's kept places are taken, and there is no room for the others
            continue
        calls = candidates[job.pk].calls
        chosen.setdefault(job.pk, []).append(calls.popleft())
        job.dispatch_pass += 1.0 / job.priority
        free -= 1
        if calls:
            heapq.heappush(heap, (job.dispatch_pass, job.pk, job))
    return chosen


def _send(messages: list[tuple[int, list[int]]]) -> None:
    try:
        for job_id, call_ids in messages:
            # argsrepr is what Flower and the worker log show for the task
            current_app.send_task(
                EXECUTE_CALLS_TASK,
                args=[job_id, call_ids],
                argsrepr=f"(job={job_id}, calls={len(call_ids)}, first={call_ids[0]})",
            )
    except Exception:  # broker down: the reconciler re-dispatches what was marked but not sent
        logger.exception("could not send %d call messages to the broker", len(messages))
