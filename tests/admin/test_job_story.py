"""The job page tells the story: how the job ended, how long it took and how fast, one row per
429 with its effect, a banner while its API is blocked, and a chart of the granted rate and the
blocks. Real database and Redis; the limiter is the API's own, blocked through the service."""

from __future__ import annotations

import html
import re
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Job, JobSecond, ThrottleEvent
from ratejobs.selectors.jobs import job_filter_by_outcome, job_outcome
from ratejobs.services.apis import api_block

LIST_URL = reverse("admin:ratejobs_job_changelist")
SECOND_PRECISION = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\b")


def page_url(job: Job) -> str:
    return reverse("admin:ratejobs_job_change", args=[job.pk])


def progress(client, job: Job, **query) -> dict:
    return client.get(reverse("admin:ratejobs_job_progress", args=[job.pk]), query).json()


def set_counts(job: Job, **fields) -> Job:
    """The job's counters and status as the recorder and the services leave them."""
    for name, value in fields.items():
        setattr(job, name, value)
    job.save()
    return job


@pytest.mark.parametrize(
    "status, succeeded, failed, cancelled, key, label",
    [
        ("queued", 0, 0, 0, "queued", "Queued"),
        ("running", 1, 0, 0, "running", "Running"),
        ("paused", 1, 0, 0, "paused", "Paused"),
        ("completed", 3, 0, 0, "completed", "Completed"),
        ("completed", 2, 1, 0, "completed_with_failures", "Completed with failures"),
        ("completed", 2, 0, 1, "completed_with_failures", "Completed with failures"),
        ("completed", 0, 3, 0, "failed", "Failed"),
        ("completed", 0, 2, 1, "failed", "Failed"),
        ("cancelled", 1, 0, 2, "cancelled", "Cancelled"),
    ],
)
def test_the_status_says_how_the_job_ended_on_every_page(
    root_client, make_job, status, succeeded, failed, cancelled, key, label
):
    job = set_counts(
        make_job(calls=3), status=status, succeeded=succeeded, failed=failed, cancelled=cancelled
    )
    assert tuple(job_outcome(job)) == (key, label)
    # the list's filter finds exactly the jobs with that outcome
    assert list(job_filter_by_outcome(Job.objects.all(), key)) == [job]
    data = progress(root_client, job)
    assert (data["outcome"], data["status_display"]) == (key, label)
    html = root_client.get(page_url(job)).content.decode()
    assert f'data-field="status_display" data-outcome="{key}">{label}<' in html
    assert f'data-outcome="{key}"' in html  # the bar's colour follows the outcome
    listing = root_client.get(LIST_URL, {"outcome": key}).content.decode()
    assert f'<span class="rj-outcome" data-outcome="{key}">{label}</span>' in listing
    assert root_client.get(f"/api/jobs/{job.pk}/").json()["outcome"] == key


def test_the_purge_confirmation_names_how_the_job_ended(root_client, make_job):
    job = set_counts(make_job(calls=3), status="completed", succeeded=2, failed=1)
    page = root_client.get(reverse("admin:ratejobs_job_delete", args=[job.pk])).content.decode()
    assert "completed with failures, 3 calls" in page


def test_a_cancelled_job_counts_its_unsent_calls_apart(root_client, make_job):
    job = set_counts(
        make_job(calls=3), total=300, succeeded=100, failed=20, cancelled=180, status="cancelled"
    )
    data = progress(root_client, job)
    assert data["done_text"] == "120 of 300 (180 cancelled)"
    assert (data["ran_percent"], data["cancelled_percent"]) == (40.0, 60.0)
    html = root_client.get(page_url(job)).content.decode()
    assert "120 of 300 (180 cancelled)" in html and 'aria-valuenow="40"' in html


def test_a_finished_job_shows_its_duration_and_average_rate_not_a_decayed_pace(
    root_client, make_job
):
    # given: a job that ran 600 calls in 60 s and finished five minutes ago
    now = timezone.now()
    job = set_counts(
        make_job(calls=3),
        total=600,
        succeeded=590,
        failed=10,
        status="completed",
        started=now - timedelta(seconds=360),
        finished=now - timedelta(seconds=300),
    )
    data = progress(root_client, job)
    assert (data["duration"], data["average_rate"]) == ("1 min 00 s", "10.0/s")
    assert data["pace_text"] == "10.0/s"
    assert data["eta"] == "—"
    assert SECOND_PRECISION.fullmatch(data["started"]) and SECOND_PRECISION.fullmatch(
        data["finished"]
    )
    html = root_client.get(page_url(job)).content.decode()
    assert 'data-field="duration">1 min 00 s<' in html
    assert 'data-field="average_rate">10.0/s<' in html
    assert re.search(r"<div data-live hidden><dt>pace \(last minute\)", html)  # not decayed
    created = timezone.localtime(job.created).strftime("%Y-%m-%d %H:%M:%S")
    assert created in html  # the job's own fields to the second too
    assert "10.0/s (average)" in root_client.get(LIST_URL).content.decode()


def test_the_failed_calls_sample_is_sent_again_when_asked(root_client, make_job):
    job = set_counts(make_job(calls=3), status="running", started=timezone.now(), failed=1)
    call = job.calls.get(index=2)
    call.status, call.status_code, call.error = "failed", 404, "HTTP 404"
    call.save()
    assert "failed_html" not in progress(root_client, job)
    html = progress(root_client, job, failed=1)["failed_html"]
    call_url = reverse("admin:ratejobs_call_change", args=[call.pk])
    assert f'<a href="{call_url}">2</a>' in html and "HTTP 404" in html


def test_a_running_job_shows_the_time_so_far(root_client, make_job):
    job = set_counts(
        make_job(calls=3), status="running", started=timezone.now() - timedelta(seconds=4.2)
    )
    data = progress(root_client, job)
    assert re.fullmatch(r"4\.\d s", data["duration"])
    assert data["pace_text"] == "0.0/s"


def test_a_429_and_the_rate_cut_it_caused_read_as_one_row(root_client, make_job):
    job = set_counts(make_job(calls=20), status="running", started=timezone.now())
    call = job.calls.get(index=17)
    common = {"api": job.api, "job": job, "call": call}
    # as services.calls writes them for one response: in one bulk insert
    ThrottleEvent.objects.bulk_create(
        [
            ThrottleEvent(
                kind="throttled",
                status_code=429,
                retry_after=1.0,
                rate_before=20.0,
                rate_after=13.873418021661024,
                **common,
            ),
            ThrottleEvent(
                kind="rate_decreased", rate_before=20.0, rate_after=13.873418021661024, **common
            ),
        ]
    )
    api_block(api=job.api, seconds=8)  # an operator's block of the whole API, job-less
    data = progress(root_client, job, events=1)
    assert (data["events_count"], data["events_pages"]) == (2, 1)
    rows = data["events_rows"]
    assert "429 received · Retry-After 1.0 s · rate 20.0/s → 13.9/s" in rows
    assert "rate decreased" not in rows
    assert "manual block for 8.0 s by an operator" in rows
    call_url = reverse("admin:ratejobs_call_change", args=[call.pk])
    assert f'<a href="{call_url}">17</a>' in rows  # the job's call index, linked
    assert SECOND_PRECISION.search(rows)
    html = root_client.get(page_url(job)).content.decode()
    assert 'data-field="events_count">2<' in html and rows.strip() in html
    assert "13.873" not in html


def test_each_response_is_one_row_and_a_cut_of_its_own_keeps_its_row(root_client, make_job):
    job = set_counts(make_job(calls=20), status="running", started=timezone.now())
    first, second = job.calls.get(index=3), job.calls.get(index=4)
    # given, in the order the recorder writes them (one bulk insert per batch of outcomes):
    # call 3's 429 with its cut, call 4's spent quota with its cut, call 3's second 429 (same
    # burst: no cut), and a cut of call 4 that followed no response of its own
    ThrottleEvent.objects.bulk_create(
        [
            ThrottleEvent(kind="throttled", status_code=429, rate_before=10, rate_after=7,
                          api=job.api, job=job, call=first),
            ThrottleEvent(kind="quota_exhausted", status_code=200, retry_after=2.0,
                          api=job.api, job=job, call=second),
            ThrottleEvent(kind="rate_decreased", rate_before=10, rate_after=7,
                          api=job.api, job=job, call=first),
            ThrottleEvent(kind="rate_decreased", rate_before=7, rate_after=5,
                          api=job.api, job=job, call=second),
            ThrottleEvent(kind="throttled", status_code=429, rate_before=5, rate_after=5,
                          api=job.api, job=job, call=first),
        ]
    )  # fmt: skip
    ThrottleEvent.objects.create(
        kind="rate_decreased", rate_before=5, rate_after=4, api=job.api, job=job, call=second
    )
    data = progress(root_client, job, events=1)
    assert data["events_count"] == 4
    rows = data["events_rows"]
    assert "429 received · rate 10.0/s → 7.0/s" in rows
    assert "quota used up (rate limit headers) · blocked 2.0 s · rate 7.0/s → 5.0/s" in rows
    assert "429 received · rate 5.0/s (unchanged)" in rows
    assert "rate decreased · rate 5.0/s → 4.0/s" in rows


def test_the_banner_says_until_when_and_why_while_the_api_is_blocked(root_client, make_job):
    job = set_counts(make_job(calls=3), status="running", started=timezone.now())
    assert progress(root_client, job)["blocked"] is None
    assert re.search(r'<div id="rj-block-banner"[^>]* hidden>', root_client.get(page_url(job)).text)
    api_block(api=job.api, seconds=1.5)
    blocked = progress(root_client, job)["blocked"]
    assert blocked["reason"] == "manual block by an operator"
    assert 0 < blocked["for_seconds"] <= 1.5
    assert re.fullmatch(r"\d\d:\d\d:\d\d", blocked["until"])
    assert blocked["text"].startswith(
        f"The API “{job.api.name}” is blocked until {blocked['until']}"
    )
    assert blocked["text"].endswith("No call is sent until then.")
    html = root_client.get(page_url(job)).content.decode()
    assert re.search(r'<div id="rj-block-banner"[^>]*role="status">The API', html)
    # shaded as a block of others (grey): no 429 of this job caused it
    assert re.search(
        r'class="rj-block rj-block-other"[^>]*><title>[^<]*manual block by an operator', html
    )
    time.sleep(blocked["for_seconds"] + 0.1)
    assert progress(root_client, job)["blocked"] is None


def test_the_poll_that_finds_a_block_begun_ended_or_replaced_brings_the_chart_with_it(
    root_client, make_job
):
    # given a running job whose page shows no block, and a poll that asked for no chart
    job = set_counts(make_job(calls=3), status="running", started=timezone.now())
    assert 'data-block=""' in root_client.get(page_url(job)).text
    assert "chart" not in progress(root_client, job, shown_block="")
    # when a 429 blocks its API, the next poll brings the chart with the block's span, so the
    # banner never appears beside a chart without it
    call = job.calls.get(index=1)
    api_limiter(job.api).block(1.0)
    ThrottleEvent.objects.create(
        api=job.api, job=job, call=call, kind="throttled", status_code=429, retry_after=1.0
    )
    data = progress(root_client, job, shown_block="")
    assert "429 on call 1" in data["blocked"]["reason"]
    assert 'class="rj-block"' in data["chart"]
    # and once the page shows that block, polls go on without the chart
    shown = data["blocked"]["key"]
    assert "chart" not in progress(root_client, job, shown_block=shown)
    # when an operator's longer block takes over, the chart comes again with it
    api_block(api=job.api, seconds=1.5)
    data = progress(root_client, job, shown_block=shown)
    assert data["blocked"]["reason"] == "manual block by an operator"
    # (its span joins the 429's it overlaps, titled with the first and counting the rest)
    assert re.search(r"manual block by an operator|and 1 more block\)", data["chart"])
    # and when the block ends
    shown = data["blocked"]["key"]
    time.sleep(data["blocked"]["for_seconds"] + 0.1)
    assert "chart" in progress(root_client, job, shown_block=shown)


def test_without_redis_the_page_has_no_banner_and_still_works(root_client, make_job, redis_down):
    job = set_counts(make_job(calls=3), status="running", started=timezone.now())
    assert progress(root_client, job)["blocked"] is None
    assert root_client.get(page_url(job)).status_code == 200


def test_the_chart_draws_the_rate_the_blocks_a_readable_axis_and_a_legend(
    root_client, make_api, make_job
):
    # given: an adaptive API whose rate was cut by a 429 with Retry-After 5 s, 20 s into a job
    api = make_api(rate=20.0, adaptive=True)
    start = timezone.now() - timedelta(seconds=40)
    job = set_counts(make_job(calls=3, api=api), status="running", started=start)
    for second in range(30):
        JobSecond.objects.create(job=job, at=start + timedelta(seconds=second), calls=12)
    throttled = ThrottleEvent.objects.create(
        api=api, job=job, kind="throttled", status_code=429, retry_after=5.0, rate_before=20.0,
        rate_after=14.0,
    )  # fmt: skip
    ThrottleEvent.objects.filter(pk=throttled.pk).update(created=start + timedelta(seconds=20))
    svg = progress(root_client, job, chart=1)["chart"]
    rate_line = re.search(r'<polyline class="rj-rate" points="([^"]+)"', svg)
    assert rate_line, "the granted rate is drawn"
    heights = {float(point.split(",")[1]) for point in rate_line.group(1).split()}
    assert len(heights) == 2  # 20/s, then 14/s after the cut (from the event: no samples yet)
    block = re.search(r'<rect class="rj-block" [^>]*><title>([^<]+)</title>', svg)
    assert block and "Retry-After 5.0 s from a 429" in block.group(1)
    assert re.search(r"blocked \d\d:\d\d:\d\d → \d\d:\d\d:\d\d", block.group(1))
    y_labels = re.findall(r'text-anchor="end" dy="3">([^<]+)</text>', svg)
    assert 3 <= len(y_labels) <= 5 and all(label.endswith("/s") for label in y_labels)
    assert len(re.findall(r'text-anchor="middle">\d\d:\d\d:\d\d</text>', svg)) >= 3
    assert 'class="rj-ceiling"' in svg and svg.count("ceiling 20.0/s") == 1
    assert 'class="rj-legend"' in svg and 'class="rj-429"' in svg


def test_the_chart_follows_the_limiters_own_rate_samples(root_client, make_api, make_job):
    api = make_api(rate=20.0, adaptive=True)
    job = set_counts(
        make_job(calls=3, api=api), status="running", started=timezone.now() - timedelta(seconds=5)
    )
    limiter = api_limiter(api)
    grant = limiter.acquire()
    limiter.report_throttle(grant)  # a 429: the adaptive rate is cut, and sampled
    svg = progress(root_client, job, chart=1)["chart"]
    assert 'class="rj-rate"' in svg
    assert re.search(r"<title>adaptive rate: [\d.]+/s at \d\d:\d\d:\d\d</title>", svg)


def test_a_block_by_another_users_job_does_not_name_that_job(
    admin_client_for, user, other_user, make_job
):
    # given: a staff member's running job, and a 429 on a call of another user's job on the
    # same API, which blocks it: the banner must not name the other user's job
    user.is_staff = True
    user.save()
    job = set_counts(make_job(calls=3), status="running", started=timezone.now())
    theirs = make_job(calls=5, owner=other_user)
    own_other = make_job(calls=5)
    api_limiter(job.api).block(5)
    ThrottleEvent.objects.create(
        api=job.api, job=theirs, call=theirs.calls.get(index=4), kind="throttled",
        status_code=429, retry_after=5.0,
    )  # fmt: skip
    client = admin_client_for(user)
    assert client.get(page_url(theirs)).status_code != 200  # not theirs to see
    data = progress(client, job, chart=1)
    # expect: the banner and the chart's block say "another user's job", never its id
    assert data["blocked"]["reason"] == (
        "Retry-After 5.0 s from a 429 on call 4 of another user's job"
    )
    page = client.get(page_url(job)).content.decode()
    for text in (data["blocked"]["text"], data["chart"], page):
        assert f"job {theirs.pk}" not in text
        assert "of another user's job" in html.unescape(text)
    # and a 429 on another job of the same owner names it, as they may open it
    api_limiter(job.api).block(30)
    ThrottleEvent.objects.create(
        api=job.api, job=own_other, call=own_other.calls.get(index=2), kind="throttled",
        status_code=429, retry_after=30.0,
    )  # fmt: skip
    assert progress(client, job)["blocked"]["reason"] == (
        f"Retry-After 30 s from a 429 on call 2 of job {own_other.pk}"
    )
