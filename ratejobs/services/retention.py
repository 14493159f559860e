"""Retention: throttle events and stored response bodies removed once they are older than
RATEJOBS_KEEP_EVENTS_DAYS and RATEJOBS_KEEP_BODIES_DAYS (the calls' attempts go with the
bodies: they are the rest of what each response said), and finished jobs purged with all they
hold. Everything goes in batches of at most BATCH_ROWS rows, each batch its own short
transaction, so no lock is held long enough for a worker to notice (bench.retention measures
it on a million rows)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet, Subquery

from ratejobs.celery_settings import PURGE_TASK
from ratejobs.infra.clock import database_now
from ratejobs.infra.connections import redis_client
from ratejobs.models import Call, CallAttempt, Job, JobPause, JobSecond, ThrottleEvent
from ratejobs.namespace import redis_key
from ratejobs.services.kept_uploads import kept_uploads_remove_expired

logger = logging.getLogger(__name__)

# Rows per transaction. A worker's commit waits behind the WAL a batch flushes at its own
# commit, so a batch stays small enough for that wait to stay well under a second (clearing
# 2,000 bodies of 1 KiB flushes about 2.5 MiB; bench.retention measures the wait), while the
# per-batch overhead stays small (a few statements).
BATCH_ROWS = 2_000
# One run of the retention or purge task works this long at most and leaves the rest to the
# next: the pool process it holds also dispatches and sends calls, and a run ends well inside
# the tasks' soft time limit (CELERY_TASK_SOFT_TIME_LIMIT).
RUN_SECONDS = 60.0
# After each batch, a rest of this many times as long as it took: the workers' own writes get
# the disk between batches, and WAL and dirty pages pile up at half the speed, which keeps
# the workers' own writes fast while bodies are cleared and calls purged (bench.retention).
PAUSE_RATIO = 1.0
# Purges asked for within this long (an admin action on many jobs) share one task run.
PURGE_DEBOUNCE_SECONDS = 1.0
FINISHED = (Job.Status.COMPLETED, Job.Status.CANCELLED)
# What refers to a job, deleted before it by a purge.
JOB_ROWS = (JobSecond, JobPause, ThrottleEvent, CallAttempt, Call)


@dataclass
class Removed:
    """What a removal did: rows deleted or cleared, in how many batches (transactions), the
    longest batch in seconds, and whether it reached the end before its deadline."""

    rows: int = 0
    batches: int = 0
    longest_batch: float = 0.0
    done: bool = True

    def add_batch(self, rows: int, seconds: float) -> None:
        self.rows += rows
        self.batches += 1
        self.longest_batch = max(self.longest_batch, seconds)

    def merge(self, other: Removed) -> None:
        self.rows += other.rows
        self.batches += other.batches
        self.longest_batch = max(self.longest_batch, other.longest_batch)
        self.done = self.done and other.done


@dataclass(frozen=True)
class RetentionResult:
    purged: Removed  # rows of jobs whose purge was asked for
    events: Removed
    bodies: Removed


class JobPurgeRefused(Exception):
    """The job cannot be purged as it stands; the message says why, for a person to read."""

    def __init__(self, job: Job, message: str) -> None:
        super().__init__(message)
        self.job = job


def _batch_done(removed: Removed, rows: int, began: float) -> None:
    """Count a batch that began at `began` (perf_counter), then rest before the next one."""
    seconds = time.perf_counter() - began
    removed.add_batch(rows, seconds)
    time.sleep(seconds * PAUSE_RATIO)


def _out_of_time(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _cutoff(days: int, now: datetime) -> datetime | None:
    """Rows older than this go; None keeps them for ever (days 0 or less)."""
    return now - timedelta(days=days) if days > 0 else None


def _delete_in_batches(
    rows: QuerySet, removed: Removed, *, batch_size: int, deadline: float | None
) -> bool:
    """Delete `rows`, of a model no other row refers to, `batch_size` at a time: each batch is
    one DELETE (Django deletes such rows without loading them), so one short transaction of its
    own. False if the deadline came first."""
    model = rows.model
    while not _out_of_time(deadline):
        began = time.perf_counter()
        deleted, _ = model.objects.filter(pk__in=Subquery(rows.values("pk")[:batch_size])).delete()
        if not deleted:
            return True
        _batch_done(removed, deleted, began)
    return False


def throttle_events_remove_old(
    *, days: int, batch_size: int = BATCH_ROWS, deadline: float | None = None
) -> Removed:
    """Delete throttle events created more than `days` ago (none when days is 0)."""
    removed = Removed()
    cutoff = _cutoff(days, database_now())
    if cutoff is not None:
        old = ThrottleEvent.objects.filter(created__lt=cutoff).order_by("created")
        removed.done = _delete_in_batches(old, removed, batch_size=batch_size, deadline=deadline)
    return removed


def call_bodies_remove_old(
    *, days: int, batch_size: int = BATCH_ROWS, deadline: float | None = None
) -> Removed:
    """Clear the stored response bodies and headers of the calls of jobs that finished
    (completed or cancelled) more than `days` ago (none when days is 0), marking each call
    with the time (`response_removed_at`), and delete their attempts. Jobs still running keep
    theirs, however old."""
    removed = Removed()
    now = database_now()
    cutoff = _cutoff(days, now)
    if cutoff is None:
        return removed
    jobs = Job.objects.filter(
        status__in=FINISHED,
        finished__lt=cutoff,
        bodies_removed_at__isnull=True,
        purge_started__isnull=True,
    ).order_by("finished", "pk")
    for job_id in list(jobs.values_list("pk", flat=True)):
        try:
            removed.done = _job_bodies_remove(
                job_id, cutoff, now, removed, batch_size=batch_size, deadline=deadline
            )
        except Exception:  # one bad job must not keep every later one's bodies for ever
            logger.exception("retention: could not clear the bodies of job %s", job_id)
        if not removed.done:
            break
    return removed


def _job_bodies_remove(
    job_id: int,
    cutoff: datetime,
    now: datetime,
    removed: Removed,
    *,
    batch_size: int,
    deadline: float | None,
) -> bool:
    """Clear one job's bodies, a range of `batch_size` call indexes per transaction (its unique
    index on job and index finds them), after its attempts; False if the deadline came
    first."""
    if not _job_attempts_remove(job_id, cutoff, removed, batch_size=batch_size, deadline=deadline):
        return False
    last = Call.objects.filter(job_id=job_id).order_by("-index").values_list("index", flat=True)
    last_index = last.first()
    start = 0
    while last_index is not None and start <= last_index:
        if _out_of_time(deadline):
            return False
        began = time.perf_counter()
        with transaction.atomic():
            if not _job_locked_if_still_old(job_id, cutoff):
                return True
            cleared = (
                Call.objects.filter(job_id=job_id, index__gte=start, index__lt=start + batch_size)
                .filter(Q(response_body__isnull=False) | Q(response_headers__isnull=False))
                .update(
                    response_body=None,
                    response_headers=None,
                    response_truncated=False,
                    response_removed_at=now,
                )
            )
        _batch_done(removed, cleared, began)
        start += batch_size
    Job.objects.filter(pk=job_id, status__in=FINISHED, finished__lt=cutoff).update(
        bodies_removed_at=now
    )
    return True


def _job_locked_if_still_old(job_id: int, cutoff: datetime) -> bool:
    """Whether the job is still finished before `cutoff`, holding its row's lock when it is
    (inside the caller's transaction). Every writer of a job's calls takes that lock first: a
    retry of its failed calls cannot start between this check and the caller's write."""
    locked = (
        Job.objects.select_for_update()
        .filter(pk=job_id, status__in=FINISHED, finished__lt=cutoff)
        .values_list("pk", flat=True)
        .first()
    )
    return locked is not None


def _job_attempts_remove(
    job_id: int, cutoff: datetime, removed: Removed, *, batch_size: int, deadline: float | None
) -> bool:
    """Delete one finished job's call attempts, `batch_size` per transaction; False if the
    deadline came first. A call has many attempts: counted by attempt, not by call, a batch
    stays as small as the bodies' batches."""
    while not _out_of_time(deadline):
        began = time.perf_counter()
        with transaction.atomic():
            # the attempts of a retry of its failed calls, started meanwhile, are not the old
            # ones this removes
            if not _job_locked_if_still_old(job_id, cutoff):
                return True
            batch = CallAttempt.objects.filter(job_id=job_id).values("pk")[:batch_size]
            deleted, _ = CallAttempt.objects.filter(pk__in=Subquery(batch)).delete()
        if not deleted:
            return True
        _batch_done(removed, deleted, began)
    return False


def job_purge_refusal(job: Job) -> str | None:
    """Why the job, as loaded, cannot be purged; None when it can (its calls not counted)."""
    if job.status not in FINISHED:
        return (
            f"Cannot purge a {job.status} job; only completed or cancelled jobs (cancel it first)."
        )
    return None


def _purge_mark(job: Job) -> bool:
    """Mark the job as being purged, which hides it everywhere at once; JobPurgeRefused if it
    is not finished or calls of it are still being sent. False when it is already gone."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(pk=job.pk).first()
        if locked is None:
            return False
        if locked.purge_started is not None:  # a purge left half-done: go on with it
            return True
        refusal = job_purge_refusal(locked)
        if refusal is None:
            # A cancelled job's calls that were being sent finish and are recorded; purging
            # under them would make their outcome refer to rows that are gone.
            busy = Call.objects.filter(
                job_id=job.pk, status__in=(Call.Status.PENDING, Call.Status.RUNNING)
            ).count()
            if busy:
                refusal = (
                    f"Cannot purge the job yet: {busy} of its calls are still being sent or "
                    "waiting to be cancelled; try again in a minute."
                )
        if refusal is not None:
            raise JobPurgeRefused(locked, refusal)
        Job.objects.filter(pk=job.pk).update(purge_started=database_now())
    return True


def job_purge(*, job: Job, batch_size: int = BATCH_ROWS, deadline: float | None = None) -> Removed:
    """Delete a finished job and everything of it: its per-second counts, throttle events,
    call attempts and calls in batches, then the job. JobPurgeRefused for a job not finished.
    The job is hidden from every list before the first batch; run again, this finishes a purge
    left half-done.
    `done` is False when the deadline came first (the job stays hidden; beat goes on)."""
    removed = Removed()
    if not _purge_mark(job):
        return removed
    for rows in (
        JobSecond.objects.filter(job_id=job.pk),
        JobPause.objects.filter(job_id=job.pk),
        ThrottleEvent.objects.filter(job=job),
        CallAttempt.objects.filter(job_id=job.pk),  # before the calls they refer to
    ):
        if not _delete_in_batches(rows, removed, batch_size=batch_size, deadline=deadline):
            removed.done = False
            return removed
    if not _calls_delete(job.pk, removed, batch_size=batch_size, deadline=deadline):
        removed.done = False
        return removed
    # Look for what is left once more, outside any transaction: besides making sure nothing
    # is, the scans mark the index entries of the rows deleted above as dead, so that the
    # foreign-key checks of the job's deletion, run under its row lock, skip them instead of
    # visiting a million dead rows (bench.retention).
    left = [model.objects.filter(job_id=job.pk).exists() for model in JOB_ROWS]  # each scanned
    if any(left):
        removed.done = False  # written meanwhile: the next run goes on
        return removed
    began = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        # the table's name comes from the model; Django's delete would look for the rows of
        # each related model again, under the lock
        cursor.execute(
            f"DELETE FROM {connection.ops.quote_name(Job._meta.db_table)} WHERE id = %s",  # noqa: S608
            [job.pk],
        )
        deleted = cursor.rowcount
    _batch_done(removed, deleted, began)
    return removed


def _calls_delete(
    job_id: int, removed: Removed, *, batch_size: int, deadline: float | None
) -> bool:
    """Delete the job's calls in index order, a batch per transaction; False if the deadline
    came first. Django's own delete would load every call, bodies included, to null the
    throttle events that point at them: those are nulled here with one UPDATE instead."""
    quote = connection.ops.quote_name
    calls, events = quote(Call._meta.db_table), quote(ThrottleEvent._meta.db_table)
    call_column = quote(ThrottleEvent._meta.get_field("call").column)
    start = 0
    while not _out_of_time(deadline):
        began = time.perf_counter()
        with transaction.atomic():
            batch = list(
                Call.objects.filter(job_id=job_id, index__gte=start)
                .order_by("index")
                .values_list("pk", "index")[:batch_size]
            )
            if not batch:
                return True
            matches, params = _among([pk for pk, _ in batch])
            # names come from the models; the ids go as parameters
            with connection.cursor() as cursor:
                # The job's own events are gone already; an event of another job pointing
                # here keeps its row, as the model says (SET_NULL).
                cursor.execute(
                    f"UPDATE {events} SET {call_column} = NULL WHERE {call_column} {matches}",  # noqa: S608
                    params,
                )
                cursor.execute(f"DELETE FROM {calls} WHERE id {matches}", params)  # noqa: S608
        _batch_done(removed, len(batch), began)
        start = batch[-1][1] + 1
    return False


def _among(ids: list[int]) -> tuple[str, list]:
    """SQL for "is one of `ids`" and its parameters: one array on PostgreSQL, where binding
    thousands of parameters of their own took longer than the statement itself (5,000 ids: 9
    against 40 to 100 ms)."""
    if connection.vendor == "postgresql":
        return "= ANY(%s)", [ids]
    return f"IN ({', '.join(['%s'] * len(ids))})", list(ids)


def job_purge_request(*, job: Job) -> None:
    """Hide the job at once and have a worker purge it (JobPurgeRefused if it is not
    finished); beat finishes it should the message be lost."""
    with transaction.atomic():
        if _purge_mark(job):
            transaction.on_commit(request_purge)


def request_purge() -> None:
    """Ask for a purge run within a second; requests within that time share one run."""
    try:
        key = redis_key("purge", "pending")
        if redis_client().set(key, 1, nx=True, px=int(PURGE_DEBOUNCE_SECONDS * 1000)):
            current_app.send_task(PURGE_TASK, countdown=PURGE_DEBOUNCE_SECONDS)
    except (redis.RedisError, OSError):
        logger.warning("Redis unreachable: purge left to beat's next retention run")
    except Exception:  # the broker (also Redis by default) refused the message
        logger.exception("could not request a purge run; beat's next retention run will")


def jobs_purge_requested(*, batch_size: int = BATCH_ROWS, deadline: float | None = None) -> Removed:
    """Purge every job whose purge was asked for, oldest request first, until none is left
    (jobs marked while this runs included) or the deadline comes."""
    removed = Removed()
    failed: set[int] = set()
    while removed.done:
        job = (
            Job.objects.filter(purge_started__isnull=False)
            .exclude(pk__in=failed)
            .order_by("purge_started", "pk")
            .first()
        )
        if job is None:
            break
        try:
            removed.merge(job_purge(job=job, batch_size=batch_size, deadline=deadline))
        except Exception:  # logged with its id; the others go on
            logger.exception("could not purge job %s; going on with the others", job.pk)
            failed.add(job.pk)
    return removed


def purge_run(*, run_seconds: float = RUN_SECONDS) -> Removed:
    """The purge task: purge what was asked for, for `run_seconds` at most, and ask for
    another run if some is left."""
    removed = jobs_purge_requested(deadline=time.monotonic() + run_seconds)
    if not removed.done:
        request_purge()
    return removed


def retention_run(*, run_seconds: float = RUN_SECONDS) -> RetentionResult:
    """The beat task: finish purges asked for (or left half-done by a crash), then remove
    throttle events and response bodies past RATEJOBS_KEEP_EVENTS_DAYS and
    RATEJOBS_KEEP_BODIES_DAYS, for `run_seconds` at most; the next run goes on."""
    deadline = time.monotonic() + run_seconds
    result = RetentionResult(
        purged=jobs_purge_requested(deadline=deadline),
        events=throttle_events_remove_old(
            days=settings.RATEJOBS_KEEP_EVENTS_DAYS, deadline=deadline
        ),
        bodies=call_bodies_remove_old(days=settings.RATEJOBS_KEEP_BODIES_DAYS, deadline=deadline),
    )
    kept_uploads_remove_expired()  # at most one file a user: one statement
    parts = (result.purged, result.events, result.bodies)
    if any(part.rows for part in parts):
        logger.info(
            "retention: %d rows of purged jobs, %d throttle events, %d response bodies removed "
            "(longest batch %.3f s)%s",
            result.purged.rows,
            result.events.rows,
            result.bodies.rows,
            max(part.longest_batch for part in parts),
            "" if all(part.done for part in parts) else "; the next run goes on",
        )
    return result
