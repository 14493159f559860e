"""Retention: throttle events and stored response bodies older than their settings go, in
batches, and nothing younger; a removed body says so in the REST API and the admin."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from project.celery import app
from ratejobs import tasks
from ratejobs.celery_settings import RETENTION_TASK
from ratejobs.models import Call, Job, ThrottleEvent
from ratejobs.services.jobs import job_retry_failed
from ratejobs.services.retention import call_bodies_remove_old, throttle_events_remove_old
from tests.services.conftest import BODY

# The services' Redis (the purge request's debounce) and the REST throttle are the test's.
pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("services_redis", "throttles_in_the_test_redis"),
]


def _events_aged(api, ages_in_days: list[float]) -> list[int]:
    ids = []
    for age in ages_in_days:
        event = ThrottleEvent.objects.create(api=api, kind="blocked")
        created = timezone.now() - timedelta(days=age)
        ThrottleEvent.objects.filter(pk=event.pk).update(created=created)
        ids.append(event.pk)
    return ids


def test_throttle_events_older_than_the_cutoff_go_in_batches_and_no_others(api):
    # given 7 events past 30 days and 4 younger, one of them a minute short of the cutoff
    old = _events_aged(api, [30.01, 31, 45, 60, 90, 365, 400])
    young = _events_aged(api, [29.999, 10, 1, 0])
    removed = throttle_events_remove_old(days=30, batch_size=3)
    # expect: exactly the old ones, 3 + 3 + 1 at a time
    assert (removed.rows, removed.batches, removed.done) == (7, 3, True)
    assert set(ThrottleEvent.objects.values_list("pk", flat=True)) == set(young)
    assert not ThrottleEvent.objects.filter(pk__in=old).exists()
    assert throttle_events_remove_old(days=30, batch_size=3).rows == 0


def test_zero_days_keeps_events_and_bodies_for_ever(api, finished_job):
    _events_aged(api, [1000])
    job = finished_job(age_days=1000)
    assert throttle_events_remove_old(days=0).rows == 0
    assert call_bodies_remove_old(days=0).rows == 0
    assert ThrottleEvent.objects.filter(job=None).count() == 1
    assert not Call.objects.filter(job=job, response_body=None).exists()


def test_bodies_of_jobs_finished_before_the_cutoff_are_cleared_and_marked(finished_job):
    # given old completed and cancelled jobs, a recent one, and an old one running again
    old = finished_job(calls=5, age_days=40)
    old_cancelled = finished_job(calls=3, age_days=31, status="cancelled")
    recent = finished_job(calls=5, age_days=29)
    running = finished_job(calls=2, age_days=40)
    Job.objects.filter(pk=running.pk).update(status="running", finished=None)
    # and a call of the old job that never got an answer: nothing of it to remove
    unanswered = Call.objects.get(job=old, index=4)
    Call.objects.filter(pk=unanswered.pk).update(
        response_body=None, response_headers=None, status_code=None
    )

    removed = call_bodies_remove_old(days=30, batch_size=2)

    # expect: 4 + 3 calls cleared, in index ranges of 2 (3 batches + 2 batches)
    assert (removed.rows, removed.batches, removed.done) == (7, 5, True)
    for job in (old, old_cancelled):
        answered = Call.objects.filter(job=job, status_code=200)
        cleared = answered.filter(response_body=None, response_headers__isnull=True)
        assert cleared.count() == answered.count()
        assert not answered.filter(response_removed_at=None).exists()
        assert not answered.filter(response_truncated=True).exists()
        job.refresh_from_db()
        assert job.bodies_removed_at is not None
    assert Call.objects.get(pk=unanswered.pk).response_removed_at is None
    for job in (recent, running):
        assert set(Call.objects.filter(job=job).values_list("response_body", flat=True)) == {BODY}
        assert not Call.objects.filter(job=job).exclude(response_removed_at=None).exists()
    # a later run skips the jobs done already
    assert call_bodies_remove_old(days=30, batch_size=2).batches == 0


def test_a_removed_body_says_so_in_the_rest_api_and_the_admin(
    finished_job, client_for, admin_client_for, user, superuser
):
    job = finished_job(calls=2, age_days=40)
    call_bodies_remove_old(days=30)
    client = client_for(user)

    one = client.get(f"/api/jobs/{job.pk}/calls/0/").json()
    listed = client.get(f"/api/jobs/{job.pk}/calls/").json()["results"][0]
    for shown in (one, listed):
        assert shown["response_body"] is None and shown["status_code"] == 200
        assert shown["response_removed_at"] is not None
        assert shown["response_body_omitted"] is False
    page = admin_client_for(superuser).get(
        f"/admin/ratejobs/call/{Call.objects.get(job=job, index=0).pk}/change/"
    )
    assert "body and headers removed after 40 days (retention)" in page.content.decode()
    # a call whose body is there has no removal time
    kept = finished_job(calls=1)
    assert client.get(f"/api/jobs/{kept.pk}/calls/0/").json()["response_removed_at"] is None


def test_a_retried_job_has_its_bodies_looked_at_again_once_finished(finished_job):
    job = finished_job(calls=2, age_days=40)
    call_bodies_remove_old(days=30)
    Call.objects.filter(job=job, index=1).update(status="failed")
    Job.objects.filter(pk=job.pk).update(succeeded=1, failed=1)
    job_retry_failed(job=job)
    job.refresh_from_db()
    assert (job.status, job.bodies_removed_at) == ("running", None)


def test_beat_runs_retention_with_the_configured_days(api, finished_job, settings):
    # given the schedule beat reads, and days set as an operator would
    entries = [entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()]
    assert RETENTION_TASK in entries
    assert RETENTION_TASK in app.tasks
    settings.RATEJOBS_KEEP_EVENTS_DAYS = 7
    settings.RATEJOBS_KEEP_BODIES_DAYS = 20
    _events_aged(api, [8, 6])
    job = finished_job(calls=2, age_days=21)
    # expect: the task, run as a worker runs it, removes what those days say
    result = tasks.retention_run.apply().get()
    assert result == {"purged_rows": 0, "events": 3, "bodies": 2}
    assert ThrottleEvent.objects.count() == 1
    assert not Call.objects.filter(job=job).exclude(response_body=None).exists()
