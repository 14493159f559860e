"""A job's pauses (issue 26): each is recorded with the status change that began and ended it,
on the database's clock; a cancelled or completed job leaves its pause ended; its duration and
average rate leave paused time out; a purge takes its pauses with it. Real PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from ratejobs.infra.clock import database_now
from ratejobs.models import Job, JobPause
from ratejobs.selectors.jobs import job_average_rate, job_duration_seconds
from ratejobs.services import jobs as job_services
from ratejobs.services.jobs import (
    job_cancel,
    job_complete_if_done,
    job_pause,
    job_resume,
)
from ratejobs.services.retention import job_purge

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[datetime], None]]:
    """Set the database time the services read for the next pause, resume or cancel."""
    moment: list[datetime] = []
    monkeypatch.setattr(job_services, "database_now", lambda: moment[-1])
    yield moment.append


def _started_a_minute_ago(make_job: Callable[..., Job], **fields: Any) -> tuple[Job, datetime]:
    start = database_now() - timedelta(seconds=60)
    job = make_job(calls=100)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started=start, **fields)
    job.refresh_from_db()
    return job, start


def _spans(job: Job) -> list[tuple[datetime, datetime | None]]:
    return list(
        JobPause.objects.filter(job=job).order_by("started").values_list("started", "ended")
    )


def test_pause_and_resume_record_the_interval_on_the_database_clock(make_job):
    job, _ = _started_a_minute_ago(make_job)
    before = database_now()

    job_pause(job=job)
    ((started, ended),) = _spans(job)
    assert ended is None and started >= before

    job_resume(job=job)
    ((started_again, ended),) = _spans(job)
    assert started_again == started and ended is not None and ended >= started
    job.refresh_from_db()
    assert job.paused_seconds == pytest.approx((ended - started).total_seconds())


def test_a_pause_refused_opens_nothing_and_the_open_pause_is_one_per_job(make_job):
    job, _ = _started_a_minute_ago(make_job)
    job_pause(job=job)
    job_pause(job=job)  # already paused: nothing changes
    assert len(_spans(job)) == 1
    job_resume(job=job)
    job_resume(job=job)  # already running: nothing to end
    job_pause(job=job)
    assert [ended is None for _, ended in _spans(job)] == [False, True]
    # and the database holds to one open pause whatever writes it
    with pytest.raises(IntegrityError), transaction.atomic():
        JobPause.objects.create(job=job, started=database_now())


def test_a_cancel_ends_the_open_pause_at_the_cancel(make_job, clock):
    job, start = _started_a_minute_ago(make_job, succeeded=20)
    clock(start + timedelta(seconds=10))
    job_pause(job=job)
    clock(start + timedelta(seconds=50))
    job = job_cancel(job=job)

    assert job.status == Job.Status.CANCELLED
    assert _spans(job) == [(start + timedelta(seconds=10), job.finished)]
    assert job.finished == start + timedelta(seconds=50)
    # 50 s from start to cancel, 40 of them paused
    assert job_duration_seconds(job) == pytest.approx(10.0)
    assert job_average_rate(job) == pytest.approx(2.0)


def test_a_paused_job_that_completes_leaves_its_pause_ended(make_job):
    job, _ = _started_a_minute_ago(make_job)
    job_pause(job=job)
    # its deadline cancelled what was left
    Job.objects.filter(pk=job.pk).update(cancelled=job.total)

    assert job_complete_if_done(job_id=job.pk)

    job.refresh_from_db()
    ((_, ended),) = _spans(job)
    assert job.status == Job.Status.COMPLETED and ended is not None


def test_two_pauses_of_ten_seconds_leave_a_minute_run_at_forty_seconds(make_job, clock):
    job, start = _started_a_minute_ago(make_job, succeeded=80)
    for paused, resumed in ((10, 20), (30, 40)):
        clock(start + timedelta(seconds=paused))
        job_pause(job=job)
        clock(start + timedelta(seconds=resumed))
        job_resume(job=job)
    job.refresh_from_db()

    assert job.status == Job.Status.RUNNING and job.paused_seconds == pytest.approx(20.0)
    assert job_duration_seconds(job) == pytest.approx(40.0, abs=1.0)
    assert job_average_rate(job) == pytest.approx(2.0, rel=0.03)


def test_the_pause_a_job_is_in_is_left_out_until_now(make_job, clock):
    job, start = _started_a_minute_ago(make_job, succeeded=20)
    clock(start + timedelta(seconds=10))
    job_pause(job=job)
    clock(start + timedelta(seconds=20))
    job_resume(job=job)
    clock(start + timedelta(seconds=30))
    job = job_pause(job=job)

    # 60 s since the start: 10 in the pause that ended, 30 in the one still open
    assert job.status == Job.Status.PAUSED
    assert job_duration_seconds(job) == pytest.approx(20.0, abs=1.0)
    assert job_average_rate(job) == pytest.approx(1.0, rel=0.05)


def test_a_job_paused_before_it_started_counts_none_of_it(make_job, clock):
    job = make_job(calls=3)  # queued, not started
    now = database_now()
    clock(now - timedelta(seconds=30))
    job_pause(job=job)
    clock(now - timedelta(seconds=20))
    job_resume(job=job)
    Job.objects.filter(pk=job.pk).update(started=now - timedelta(seconds=10), succeeded=3)
    job.refresh_from_db()

    assert len(_spans(job)) == 1 and job.paused_seconds == 0.0
    assert job_duration_seconds(job) == pytest.approx(10.0, abs=1.0)


def test_a_paused_job_without_a_recorded_pause_has_no_average(make_job):
    # paused before pauses were recorded: when, nobody knows
    job, _ = _started_a_minute_ago(make_job, succeeded=30)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.PAUSED)
    job.refresh_from_db()
    assert job_average_rate(job) is None
    assert job_duration_seconds(job) == pytest.approx(60.0, abs=1.0)


def test_a_purge_removes_the_job_pauses_and_no_others(finished_job):
    job = finished_job(calls=3, status="cancelled")
    other = finished_job(calls=2)
    for owner in (job, other):
        JobPause.objects.create(
            job=owner, started=owner.finished - timedelta(seconds=5), ended=owner.finished
        )

    removed = job_purge(job=job)

    assert removed.done
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not JobPause.objects.filter(job_id=job.pk).exists()
    assert JobPause.objects.filter(job=other).count() == 1


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_two_pauses_at_once_open_one_pause(make_job):
    job, _ = _started_a_minute_ago(make_job)
    ready = threading.Barrier(2)
    errors: list[BaseException] = []

    def pause() -> None:
        try:
            ready.wait(timeout=10)
            job_pause(job=Job.objects.get(pk=job.pk))
        except BaseException as exc:  # noqa: BLE001 (reported by the test below)
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=pause) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert [ended for _, ended in _spans(job)] == [None]
    assert Job.objects.get(pk=job.pk).status == Job.Status.PAUSED
