"""Purging a finished job: everything of it goes in batches and nothing of anyone else's; a job
still running is refused; the job is hidden at once and a purge cut short is finished later.
The same service behind the REST API, the admin and `manage.py purge_job`."""

from __future__ import annotations

import io
import json
import time

import pytest
from django.core.management import CommandError, call_command

from project.celery import app
from ratejobs import tasks
from ratejobs.celery_settings import PURGE_TASK
from ratejobs.models import Call, Job, JobSecond, ThrottleEvent
from ratejobs.namespace import broker_key, redis_key
from ratejobs.services.retention import (
    JobPurgeRefused,
    job_purge,
    job_purge_request,
    retention_run,
)

# The services' Redis (the purge request's debounce) and the REST throttle are the test's.
pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("services_redis", "throttles_in_the_test_redis"),
]


def _rows_of(job: Job) -> tuple[int, int, int, int]:
    return (
        Job.objects.filter(pk=job.pk).count(),
        Call.objects.filter(job_id=job.pk).count(),
        ThrottleEvent.objects.filter(job_id=job.pk).count(),
        JobSecond.objects.filter(job_id=job.pk).count(),
    )


def test_a_purge_removes_everything_of_the_job_and_nothing_else(finished_job, other_user):
    # given the job, another of the same API and another owner, and an API-wide event
    job = finished_job(calls=5, status="cancelled")
    other = finished_job(calls=3, owner=other_user)
    manual_block = ThrottleEvent.objects.create(api=job.api, kind="blocked")
    # and an event of the other job pointing at a call of this one (the model allows it)
    stray = ThrottleEvent.objects.filter(job=other).first()
    ThrottleEvent.objects.filter(pk=stray.pk).update(call=Call.objects.filter(job=job).first())

    removed = job_purge(job=job, batch_size=2)

    # expect: 2 seconds (1 batch), 5 events (3), 5 calls (3), then the job row (1)
    assert (removed.rows, removed.batches, removed.done) == (13, 8, True)
    assert _rows_of(job) == (0, 0, 0, 0)
    assert _rows_of(other) == (1, 3, 3, 2)
    assert ThrottleEvent.objects.get(pk=stray.pk).call_id is None
    assert ThrottleEvent.objects.filter(pk=manual_block.pk).exists()
    assert set(Call.objects.filter(job=other).values_list("response_body", flat=True)) != {None}


@pytest.mark.parametrize("status", ["queued", "running", "paused"])
def test_an_unfinished_job_cannot_be_purged(make_job, superuser, client_for, status):
    job = make_job(calls=2)
    Job.objects.filter(pk=job.pk).update(status=status)
    job.refresh_from_db()
    with pytest.raises(JobPurgeRefused, match=f"Cannot purge a {status} job"):
        job_purge(job=job)
    answer = client_for(superuser).delete(f"/api/jobs/{job.pk}/")
    assert answer.status_code == 409
    assert answer.json()["status"] == status and "cancel it first" in answer.json()["detail"]
    with pytest.raises(CommandError, match=f"Cannot purge a {status} job"):
        call_command("purge_job", str(job.pk), stdout=io.StringIO())
    assert _rows_of(job) == (1, 2, 0, 0)
    assert Job.objects.get(pk=job.pk).purge_started is None


def test_a_cancelled_job_waits_for_its_calls_still_being_sent(finished_job):
    job = finished_job(calls=2, status="cancelled")
    Call.objects.filter(job=job, index=1).update(status="running")
    with pytest.raises(JobPurgeRefused, match="1 of its calls are still being sent"):
        job_purge(job=job)
    assert _rows_of(job) == (1, 2, 2, 2)


def test_rest_purge_hides_the_job_at_once_and_a_worker_finishes_it(
    finished_job, client_for, superuser
):
    job = finished_job(calls=3)
    client = client_for(superuser)
    answer = client.delete(f"/api/jobs/{job.pk}/")
    assert answer.status_code == 202
    # expect: gone from every route before a single row was deleted
    assert client.get(f"/api/jobs/{job.pk}/").status_code == 404
    assert client.get(f"/api/jobs/{job.pk}/calls/").status_code == 404
    assert job.pk not in [j["id"] for j in client.get("/api/jobs/").json()["results"]]
    assert _rows_of(job)[1] == 3
    # a second DELETE finds nothing to purge
    assert client.delete(f"/api/jobs/{job.pk}/").status_code == 404
    # and the purge task, run as a worker runs it, deletes the rest
    assert tasks.purge_jobs.apply().get() == 3 + 3 + 2 + 1
    assert _rows_of(job) == (0, 0, 0, 0)


def test_only_a_superuser_purges_and_others_jobs_stay_secret(
    finished_job, client_for, user, staff, other_user
):
    mine = finished_job(calls=1, owner=user)
    theirs = finished_job(calls=1, owner=other_user)
    # deleting removes results for good: the owner may not (403), others never see it (404)
    assert client_for(user).delete(f"/api/jobs/{mine.pk}/").status_code == 403
    assert client_for(user).delete(f"/api/jobs/{theirs.pk}/").status_code == 404
    assert client_for(staff).delete(f"/api/jobs/{mine.pk}/").status_code == 404
    assert client_for(None).delete(f"/api/jobs/{mine.pk}/").status_code == 401
    assert _rows_of(mine) == (1, 1, 1, 2) and _rows_of(theirs) == (1, 1, 1, 2)
    assert Job.objects.filter(purge_started__isnull=False).count() == 0


def test_a_purge_left_half_done_is_finished_by_beat(finished_job, client_for, superuser):
    # given a purge asked for, whose worker died after deleting some of the calls
    job = finished_job(calls=6)
    assert client_for(superuser).delete(f"/api/jobs/{job.pk}/").status_code == 202
    Call.objects.filter(job=job, index__lt=3).delete()
    # expect: beat's next retention run finishes it
    result = retention_run()
    assert result.purged.done and result.purged.rows == 3 + 6 + 2 + 1
    assert _rows_of(job) == (0, 0, 0, 0)


def test_a_purge_past_its_deadline_stops_between_batches_and_resumes(finished_job):
    job = finished_job(calls=4)
    # a deadline already passed: the job is hidden and nothing else is done yet
    cut_short = job_purge(job=job, batch_size=2, deadline=time.monotonic())
    assert (cut_short.done, cut_short.batches) == (False, 0)
    assert Job.objects.get(pk=job.pk).purge_started is not None
    assert job_purge(job=job, batch_size=2).done
    assert _rows_of(job) == (0, 0, 0, 0)


def test_purge_requests_of_many_jobs_share_one_task(
    finished_job, django_capture_on_commit_callbacks, redis_client, redis_url
):
    jobs = [finished_job(calls=1) for _ in range(3)]
    queue = "ratejobs.control"
    app.conf.broker_url = redis_url

    def purge_messages() -> list[bytes]:
        return [
            raw
            for raw in redis_client.lrange(broker_key(queue), 0, -1)
            if json.loads(raw)["headers"]["task"] == PURGE_TASK
        ]

    for message in purge_messages():  # left by an interrupted run
        redis_client.lrem(broker_key(queue), 0, message)
    redis_client.delete(redis_key("purge", "pending"))
    with django_capture_on_commit_callbacks(execute=True):
        for job in jobs:
            job_purge_request(job=job)
    try:
        assert len(purge_messages()) == 1
    finally:
        for message in purge_messages():
            redis_client.lrem(queue, 0, message)


def test_the_command_purges_in_batches_and_a_second_run_finds_it_gone(finished_job):
    job = finished_job(calls=5)
    out = io.StringIO()
    call_command("purge_job", str(job.pk), "--batch-size", "2", stdout=out)
    assert f"job {job.pk} purged: 13 rows in 8 batches" in out.getvalue()
    assert _rows_of(job) == (0, 0, 0, 0)
    with pytest.raises(CommandError, match="no such job"):
        call_command("purge_job", str(job.pk), stdout=io.StringIO())


def test_the_admin_action_confirms_then_purges_finished_jobs_only(
    finished_job, make_job, admin_client_for, superuser, staff
):
    done = finished_job(calls=2)
    running = make_job(calls=1, name="still going")
    Job.objects.filter(pk=running.pk).update(status="running")
    client = admin_client_for(superuser)
    selected = {"action": "purge_selected", "_selected_action": [done.pk, running.pk]}

    confirm = client.post("/admin/ratejobs/job/", selected)
    page = confirm.content.decode()
    assert confirm.status_code == 200 and "Are you sure you want to purge" in page
    assert "2 calls" in page and "Not purged" in page and "Cannot purge a running job" in page

    purged = client.post("/admin/ratejobs/job/", {**selected, "post": "yes"}, follow=True)
    text = purged.content.decode()
    assert "1 job(s) purged" in text and "Cannot purge a running job" in text
    assert Job.objects.get(pk=done.pk).purge_started is not None
    assert Job.objects.get(pk=running.pk).purge_started is None
    assert f"/admin/ratejobs/job/{done.pk}/change/" not in text
    # the action is the superuser's only, and Django's bulk delete is not offered at all
    listing = client.get("/admin/ratejobs/job/").content.decode()
    assert "purge_selected" in listing and "delete_selected" not in listing
    staff_listing = admin_client_for(staff).get("/admin/ratejobs/job/").content.decode()
    assert "purge_selected" not in staff_listing


def test_the_admin_delete_page_of_a_job_is_its_purge(finished_job, admin_client_for, superuser):
    job = finished_job(calls=2)
    client = admin_client_for(superuser)
    page = client.get(f"/admin/ratejobs/job/{job.pk}/delete/").content.decode()
    assert "Are you sure you want to purge this job" in page and "Yes, I’m sure" in page
    done = client.post(f"/admin/ratejobs/job/{job.pk}/delete/", {"post": "yes"})
    assert done.status_code == 302 and done.headers["Location"] == "/admin/ratejobs/job/"
    assert Job.objects.get(pk=job.pk).purge_started is not None
    # the job's page is now gone, as a missing job's is
    assert client.get(f"/admin/ratejobs/job/{job.pk}/change/").status_code == 302
