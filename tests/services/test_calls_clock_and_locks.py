"""Whether a call is due is judged on the database's clock, never a worker's own, and the
reconciler's locks hold against pause and cancel.
PostgreSQL only: SQLite is one file on one machine, with one clock and one writer at a time."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from ratejobs.infra.clock import database_now
from ratejobs.models import Call, Job
from ratejobs.services.calls import call_attempt_by_id
from ratejobs.services.jobs import (
    job_cancel,
    job_complete_if_done,
    job_create,
    job_lock,
    job_pause,
    job_resume,
)
from ratejobs.worker.dispatch import dispatch_api
from ratejobs.worker.reconcile import reconcile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

# How long pause, resume, cancel and reconcile race each other.
RACE_SECONDS = 3.0


def test_a_call_is_due_by_the_database_clock_not_by_a_worker_clock_an_hour_ahead(
    http_server: Any, marker: str, make_api: Any, user: Any, monkeypatch: pytest.MonkeyPatch
):
    # given a call that waits a minute for its next attempt (by the database's clock)
    api = make_api(base_url=http_server.base, credential="")
    job = job_create(owner=user, api=api, name="clock", calls=[{"path": f"/echo/{marker}"}])
    call = Call.objects.get(job=job)
    Call.objects.filter(pk=call.pk).update(next_attempt_at=database_now() + timedelta(minutes=1))
    # and a worker whose clock runs an hour ahead
    skewed = timezone.now() + timedelta(hours=1)
    monkeypatch.setattr(timezone, "now", lambda: skewed)
    # when that worker dispatches the API's calls and runs the call
    dispatched = dispatch_api(api_id=api.pk).dispatched
    Call.objects.filter(pk=call.pk).update(dispatched_at=database_now())
    kind = call_attempt_by_id(call_id=call.pk)
    # expect: nothing dispatched, nothing sent: the call is not due for another minute
    assert (dispatched, kind) == (0, "skipped")
    assert http_server.requests_with(marker) == []
    assert Call.objects.get(pk=call.pk).status == "pending"


def test_a_job_finishes_on_the_database_clock_not_on_the_completing_workers(
    make_api: Any, user: Any, monkeypatch: pytest.MonkeyPatch
):
    # given a job whose only call has ended, on the database's clock
    api = make_api(base_url="http://127.0.0.1:9", credential="")
    job = job_create(owner=user, api=api, name="finish", calls=[{"path": "/x"}])
    ended = database_now()
    Call.objects.filter(job=job).update(status=Call.Status.SUCCEEDED, finished=ended)
    Job.objects.filter(pk=job.pk).update(succeeded=1, started=ended - timedelta(seconds=1))
    # and a worker whose clock runs 30 s ahead
    skewed = timezone.now() + timedelta(seconds=30)
    monkeypatch.setattr(timezone, "now", lambda: skewed)
    # when that worker completes the job
    with transaction.atomic():
        assert job_complete_if_done(job_id=job.pk)
    # expect: it finished when its call did, not 30 s later
    job.refresh_from_db()
    assert job.status == Job.Status.COMPLETED
    assert abs((job.finished - ended).total_seconds()) < 5


def test_reconcile_pause_resume_and_cancel_racing_never_deadlock(make_api: Any, user: Any):
    # given jobs with calls running on a worker that died (no heartbeat)
    api = make_api(base_url="http://127.0.0.1:9", rate=1000.0, burst=100)
    jobs = [
        job_create(owner=user, api=api, name=f"race {n}", calls=[{"path": "/x"}] * 40)
        for n in range(3)
    ]

    def orphan_some(job: Job) -> None:
        # as every writer of a job's calls does: the job's lock first (a claim takes none,
        # but it only ever moves calls the others leave alone: dispatched, due, pending)
        with transaction.atomic():
            job_lock(job.pk)
            Call.objects.filter(job=job, status="pending", index__lt=20).update(
                status="running",
                claim_token="t",
                claim_owner="gone:1:dead",
                running_until=timezone.now() + timedelta(minutes=5),
            )

    errors: list[BaseException] = []
    stop = time.monotonic() + RACE_SECONDS

    def loop(work) -> None:
        try:
            while time.monotonic() < stop:
                work()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def pause_and_resume() -> None:
        for job in jobs:
            orphan_some(job)
            job_pause(job=job)
            job_resume(job=job)

    # when the reconciler, pause/resume and dispatch run at once, then every job is cancelled
    racers = [
        threading.Thread(target=loop, args=(reconcile,)),
        threading.Thread(target=loop, args=(pause_and_resume,)),
        threading.Thread(target=loop, args=(lambda: dispatch_api(api_id=api.pk),)),
    ]
    for racer in racers:
        racer.start()
    for job in jobs:
        time.sleep(RACE_SECONDS / 4)
        try:
            job_cancel(job=job)
        except OperationalError as exc:
            errors.append(exc)
    for racer in racers:
        racer.join(60)
    reconcile()
    # expect: no deadlock was detected, and every call of every job ended final, counted once
    assert [f"{type(e).__name__}: {e}" for e in errors] == []
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        assert job.status == "cancelled"
        assert job.cancelled + job.succeeded + job.failed == job.total == 40
        assert not job.calls.exclude(status__in=Call.FINAL).exists()
