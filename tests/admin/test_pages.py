"""The job list, the job page and its actions, calls and throttle events, as staff see them."""

from __future__ import annotations

import re
from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ratejobs.models import Call, Job, ThrottleEvent
from ratejobs.services.jobs import job_seconds_add

LIST_URL = reverse("admin:ratejobs_job_changelist")


def finish_calls(job: Job, count: int, *, seconds_ago: float = 5.0) -> None:
    """Mark the job's first calls succeeded as a worker would (their seconds counted too, as
    the recorder does), spread over the last seconds."""
    now = timezone.now()
    job.started = now - timedelta(seconds=seconds_ago + 1)
    for offset, call in enumerate(job.calls.order_by("index")[:count]):
        call.status = Call.Status.SUCCEEDED
        call.finished = now - timedelta(seconds=seconds_ago * offset / max(count, 1))
        call.status_code = 200
        call.save()
        job_seconds_add({job.pk: 1}, call.finished)
    job.succeeded = count
    job.status = Job.Status.RUNNING
    job.save()


def test_the_job_list_shows_progress_counts_pace_and_eta(root_client, make_job):
    job = make_job(calls=20)
    finish_calls(job, 10)
    html = root_client.get(LIST_URL).content.decode()
    assert 'class="rj-progress"' in html
    assert 'aria-valuenow="50"' in html
    assert re.search(r"\d+\.\d/s", html)  # pace over the last minute
    assert "column-eta_column" in html


def test_the_number_of_queries_does_not_grow_with_the_jobs_shown(root_client, make_job):
    def queries_for_list() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert root_client.get(LIST_URL).status_code == 200
        return len(captured)

    for _ in range(3):
        finish_calls(make_job(calls=4), 2)
    few = queries_for_list()
    for _ in range(30):
        finish_calls(make_job(calls=4), 2)
    assert queries_for_list() == few


def test_the_job_list_filters_searches_and_sorts(root_client, make_job):
    make_job(name="alpha")
    make_job(name="beta")
    assert "beta" not in root_client.get(LIST_URL, {"q": "alpha"}).content.decode()
    for order in ("1", "-4", "5", "-11"):  # name, status, progress, created
        assert root_client.get(LIST_URL, {"o": order}).status_code == 200
    assert root_client.get(LIST_URL, {"outcome": "queued"}).status_code == 200


def test_the_job_page_shows_progress_chart_events_and_failed_calls(root_client, make_job):
    job = make_job(calls=6)
    finish_calls(job, 3)
    failed = job.calls.get(index=5)
    failed.status, failed.status_code, failed.error = "failed", 404, "HTTP 404"
    failed.save()
    ThrottleEvent.objects.create(
        api=job.api, job=job, call=failed, kind="throttled", status_code=429, retry_after=2.5
    )
    html = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    assert 'class="rj-progress"' in html
    assert "<svg" in html and 'class="rj-bar"' in html and 'class="rj-429"' in html
    assert "429 received · Retry-After 2.5 s" in html
    assert "HTTP 404" in html
    assert 'data-progress-url="' in html
    assert 'name="_save"' not in html  # nothing is edited in place


def test_the_progress_endpoint_reports_counts_and_the_chart(root_client, make_job):
    job = make_job(calls=4)
    finish_calls(job, 2)
    url = reverse("admin:ratejobs_job_progress", args=[job.pk])
    data = root_client.get(url).json()
    assert (data["total"], data["done"], data["progress"], data["final"]) == (4, 2, 50.0, False)
    assert data["pace"] > 0
    assert data["actions"] == ["pause", "cancel"]
    assert data["started"] != "—" and data["finished"] == "—"
    assert "chart" not in data
    assert "<svg" in root_client.get(url, {"chart": 1}).json()["chart"]


def test_actions_pause_resume_cancel_and_refuse_what_makes_no_sense(root_client, make_job):
    job = make_job(calls=3)

    def act(action: str):
        url = reverse("admin:ratejobs_job_act", args=[job.pk, action])
        return root_client.post(url, {"post": "yes"}, follow=True)  # as confirmed, for cancel

    act("pause")
    assert Job.objects.get(pk=job.pk).status == "paused"
    act("resume")
    assert Job.objects.get(pk=job.pk).status == "running"
    act("cancel")
    job.refresh_from_db()
    assert (job.status, job.cancelled) == ("cancelled", 3)
    refused = act("resume").content.decode()
    assert "Cannot resume a cancelled job" in refused
    assert (
        root_client.get(reverse("admin:ratejobs_job_act", args=[job.pk, "pause"])).status_code
        == 405
    )


def test_the_job_page_offers_only_the_actions_its_status_allows(root_client, make_job):
    job = make_job(calls=3)
    page_url = reverse("admin:ratejobs_job_change", args=[job.pk])

    def offered() -> set[str]:
        html = root_client.get(page_url).content.decode()
        return set(re.findall(r'<button [^>]*data-action="([^"]+)">', html))

    assert offered() == {"pause", "cancel"}
    root_client.post(reverse("admin:ratejobs_job_act", args=[job.pk, "pause"]))
    assert offered() == {"resume", "cancel"}
    job.refresh_from_db()
    job.failed, job.status = 1, Job.Status.COMPLETED
    job.save()
    assert offered() == {"retry-failed"}


def test_staff_who_are_not_superusers_see_only_their_own_jobs(
    admin_client_for, make_job, staff, user
):
    make_job(name="mine-job", owner=staff)
    theirs = make_job(name="theirs-job", owner=user)
    client = admin_client_for(staff)
    listing = client.get(LIST_URL).content.decode()
    assert "mine-job" in listing and "theirs-job" not in listing
    for name in ("admin:ratejobs_job_change", "admin:ratejobs_job_progress"):
        assert client.get(reverse(name, args=[theirs.pk])).status_code in (302, 404)
    assert (
        client.post(
            reverse("admin:ratejobs_job_act", args=[theirs.pk, "cancel"]), {"post": "yes"}
        ).status_code
        == 404
    )
    assert Job.objects.get(pk=theirs.pk).status == "queued"
    calls = client.get(reverse("admin:ratejobs_call_changelist")).content.decode()
    assert "mine-job" in calls and "theirs-job" not in calls
    assert client.get(
        reverse("admin:ratejobs_call_change", args=[theirs.calls.first().pk])
    ).status_code in (302, 404)


def test_people_who_are_not_staff_never_reach_the_admin(admin_client_for, make_job, user):
    job = make_job()
    client = admin_client_for(user)
    for url in (LIST_URL, reverse("admin:ratejobs_job_progress", args=[job.pk])):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


def test_a_call_shows_its_response_pretty_with_size_and_truncation(root_client, make_job):
    job = make_job(calls=2)
    ok, cut = job.calls.order_by("index")
    ok.status, ok.status_code, ok.response_body = "succeeded", 200, b'{"user": {"id": 1}}'
    ok.save()
    cut.status, cut.response_body, cut.response_truncated = "succeeded", b"x" * 64, True
    cut.save()
    html = root_client.get(reverse("admin:ratejobs_call_change", args=[ok.pk])).content.decode()
    assert "JSON, 19 bytes" in html and "&quot;user&quot;: {\n" in html
    html = root_client.get(reverse("admin:ratejobs_call_change", args=[cut.pk])).content.decode()
    assert "truncated at 64 bytes" in html
    listing = root_client.get(reverse("admin:ratejobs_call_changelist"), {"job": job.pk})
    assert listing.status_code == 200


def test_throttle_events_are_listed_with_filters_and_a_date_hierarchy(root_client, make_job):
    job = make_job()
    ThrottleEvent.objects.create(api=job.api, job=job, kind="throttled", status_code=429)
    url = reverse("admin:ratejobs_throttleevent_changelist")
    html = root_client.get(url).content.decode()
    assert "429 received" in html
    assert '<nav class="toplinks">' in html  # the date hierarchy
    assert root_client.get(url, {"kind__exact": "throttled"}).status_code == 200


def test_the_admin_links_to_flower_when_its_address_is_set(root_client, settings):
    assert "Flower" not in root_client.get(LIST_URL).content.decode()
    settings.RATEJOBS_FLOWER_URL = "http://flower.example:5555/"
    html = root_client.get(LIST_URL).content.decode()
    assert '<a href="http://flower.example:5555/"' in html
