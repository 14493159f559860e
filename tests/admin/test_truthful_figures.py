"""The figures an operator found misleading (issue 26) say only what is true: no ETA or pace
where none can be measured, calls counted apart from their 429s, another job's blocks not read
as this job's calm, and finished jobs still seen for an hour. Real database and Redis."""

from __future__ import annotations

import html as html_text
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone

from ratejobs.infra.clock import database_now
from ratejobs.models import Job, JobSecond, ThrottleEvent
from ratejobs.text import moment_text

DATA_URL = reverse("ratejobs_overview_data")
LATER = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


def overview(client: Any) -> dict[str, Any]:
    response = client.get(DATA_URL)
    assert response.status_code == 200
    return response.json()


def job_row(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    return next(row for row in payload["jobs"] if row["id"] == job.pk)


def progress(client: Any, job: Job, **query: Any) -> dict[str, Any]:
    return client.get(reverse("admin:ratejobs_job_progress", args=[job.pk]), query).json()


def job_page(client: Any, job: Job) -> str:
    return client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()


def update(job: Job, **fields: Any) -> Job:
    for name, value in fields.items():
        setattr(job, name, value)
    job.save()
    return job


def test_a_job_that_starts_later_says_when_not_eta_0_s(root_client, make_job):
    # given a queued job of three calls that may not start before 2030
    job = make_job(calls=3, not_before=LATER)
    starts = f"starts at {moment_text(LATER)}"
    # expect: the overview and the job page say when it starts, and give no ETA number
    row = job_row(overview(root_client), job)
    assert (row["eta"], row["eta_seconds"]) == (starts, None)
    assert f'<td data-field="eta_note">{starts}</td>' in overview(root_client)["html"]["jobs"]
    assert progress(root_client, job)["eta"] == "—"
    html = job_page(root_client, job)
    assert f'<dd data-field="eta_note">{starts}</dd>' in html
    assert 'data-field="eta"' not in html
    assert "{#" not in html and "endcomment" not in html  # template notes never reach the page


def test_a_queued_job_waits_for_the_window_without_an_eta(root_client, make_job):
    job = make_job(calls=3)
    row = job_row(overview(root_client), job)
    assert (row["eta"], row["eta_seconds"]) == ("not started: waiting for the window", None)
    assert progress(root_client, job)["eta"] == "—"
    assert '<dd data-field="eta_note">not started: waiting for the window</dd>' in job_page(
        root_client, job
    )


def test_a_paused_job_shows_no_pace_rate_or_eta(root_client, make_job):
    # given a job that finished 30 calls in the last minute and was then paused
    now = database_now().replace(microsecond=0)
    job = update(
        make_job(calls=3),
        total=100,
        succeeded=30,
        status="paused",
        started=timezone.now() - timedelta(seconds=60),
    )
    JobSecond.objects.create(job=job, at=now - timedelta(seconds=5), calls=30)
    # expect: the overview says "paused" where the pace and the ETA were
    row = job_row(overview(root_client), job)
    assert (row["pace_text"], row["eta"], row["eta_seconds"]) == ("paused", "paused", None)
    jobs_html = overview(root_client)["html"]["jobs"]
    assert '<td data-field="pace_note">paused</td>' in jobs_html
    assert '<td data-field="eta_note">paused</td>' in jobs_html
    # and so do the job page and its poll: no last minute's pace, no average over paused time
    data = progress(root_client, job)
    assert (data["pace"], data["average_rate"], data["eta"]) == (0.0, "—", "—")
    html = job_page(root_client, job)
    assert re.search(r"<dt>pace \(last minute\)</dt><dd data-field=\"pace_text\">paused<", html)
    assert 'data-field="average_rate">—<' in html


def test_the_overview_counts_calls_apart_from_their_429s(root_client, make_api, make_job):
    # given a job whose 500 calls ended in the last minute after 4 429s
    api = make_api(rate=100.0)
    job = update(
        make_job(calls=3, api=api),
        total=500,
        succeeded=500,
        status="running",
        started=timezone.now() - timedelta(seconds=60),
    )
    now = database_now().replace(microsecond=0)
    JobSecond.objects.bulk_create(
        JobSecond(job=job, at=now - timedelta(seconds=s), calls=50) for s in range(10)
    )
    for _ in range(4):
        ThrottleEvent.objects.create(api=api, job=job, kind="throttled", status_code=429)
    payload = overview(root_client)
    row = next(row for row in payload["apis"] if row["name"] == api.name)
    # expect: 500 calls, and 4 throttled responses beside them, not "504 calls"
    assert (row["calls_finished_5m"], row["throttles_5m"], row["requests_5m"]) == (500, 4, 504)
    html = payload["html"]["apis"]
    assert re.search(r'data-field="calls_finished_5m"[^>]*>500 calls</td>', html)
    assert '<td data-field="throttles_5m">4 × 429</td>' in html
    page = root_client.get(reverse("ratejobs_overview")).content.decode()
    assert "calls finished, 5 min" in page and "throttled responses (429), 5 min" in page


def test_the_sparkline_has_a_scale_in_calls_per_second(root_client, make_api):
    # given an idle API of 20/s: its scale runs from 0 to a round value above the ceiling
    api = make_api(rate=20.0)
    row = next(row for row in overview(root_client)["apis"] if row["name"] == api.name)
    svg = next(
        html
        for html in re.findall(
            r"<tr data-api=.*?</tr>", overview(root_client)["html"]["apis"], re.S
        )
        if f'data-api="{api.name}"' in html
    )
    assert row["ceiling_per_second"] == 20.0
    assert re.search(r'<text class="rj-spark-scale"[^>]*>25/s</text>', svg)
    assert re.search(r'<text class="rj-spark-scale"[^>]*>0</text>', svg)
    assert "scale 0 to 25/s" in svg


def test_another_jobs_block_is_not_this_jobs_calm(root_client, make_job, user):
    # given a running job with no 429 of its own, and another job on the same API whose 429
    # blocked the API for 10 s while the first ran
    job = update(
        make_job(calls=3), status="running", started=timezone.now() - timedelta(seconds=40)
    )
    other = make_job(calls=3, name="other")
    event = ThrottleEvent.objects.create(
        api=job.api, job=other, kind="throttled", status_code=429, retry_after=10.0
    )
    ThrottleEvent.objects.filter(pk=event.pk).update(created=timezone.now() - timedelta(seconds=25))
    # expect: the page says whose 429 blocked the API and for how long, and never that the
    # limiter kept this job out of throttling
    chart = progress(root_client, job, chart=1)["chart"]
    assert 'class="rj-block rj-block-other"' in chart and 'class="rj-block" ' not in chart
    note = html_text.unescape(re.search(r'<p class="rj-chart-note">([^<]*)</p>', chart).group(1))
    assert note == "No 429 for this job; the API was blocked 10 s by another job's 429s (grey)."
    html = job_page(root_client, job)
    assert "No throttling" not in html and "kept this job under" not in html
    assert "No 429 for this job and no operator's block of its API." in html


def test_a_jobs_own_429_is_told_apart_from_others(root_client, make_job):
    job = update(
        make_job(calls=3), status="running", started=timezone.now() - timedelta(seconds=40)
    )
    event = ThrottleEvent.objects.create(
        api=job.api, job=job, kind="throttled", status_code=429, retry_after=5.0
    )
    ThrottleEvent.objects.filter(pk=event.pk).update(created=timezone.now() - timedelta(seconds=20))
    chart = progress(root_client, job, chart=1)["chart"]
    assert 'class="rj-block" ' in chart and "rj-block-other" not in chart
    assert "1 × 429 for this job (they blocked the API 5.0 s)." in chart


def test_jobs_that_finished_in_the_last_hour_stay_with_their_outcome(root_client, make_job):
    now = timezone.now()
    done = dict(started=now - timedelta(minutes=20), finished=now - timedelta(minutes=10))
    completed = update(make_job(name="all good"), status="completed", succeeded=3, **done)
    mixed = update(
        make_job(name="some failed"), status="completed", succeeded=2, failed=1, throttled=4, **done
    )
    cancelled = update(
        make_job(name="stopped"), status="cancelled", succeeded=1, cancelled=2, **done
    )
    old = update(
        make_job(name="long ago"),
        status="completed",
        succeeded=3,
        started=now - timedelta(hours=3),
        finished=now - timedelta(hours=2),
    )
    payload = overview(root_client)
    rows = {row["id"]: row for row in payload["finished_jobs"]}
    assert old.pk not in rows
    assert rows[completed.pk]["outcome_display"] == "Completed"
    assert rows[mixed.pk]["outcome_display"] == "Completed with failures"
    assert rows[cancelled.pk]["outcome_display"] == "Cancelled"
    assert (rows[mixed.pk]["failed_text"], rows[mixed.pk]["throttled_text"]) == (
        "1 call",
        "4 × 429",
    )
    assert rows[cancelled.pk]["cancelled_text"] == "2 calls"
    html = payload["html"]["finished"]
    assert f'<tr data-job="{mixed.pk}" data-outcome="completed_with_failures">' in html
    assert "long ago" not in html
    page = root_client.get(reverse("ratejobs_overview")).content.decode()
    assert "Recently finished (last 60 min)" in page and 'id="rj-overview-finished"' in page
