"""The overview page: every API's live state and last five minutes, the jobs in progress and
what needs attention, from real rows, the test Redis and a real block of the limiter."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ratejobs.infra.clock import database_now
from ratejobs.models import Call, Job, JobSecond, ThrottleEvent, WorkerProcess
from ratejobs.selectors.overview import TRAFFIC_BUCKETS
from ratejobs.services.apis import api_block

PAGE_URL = reverse("ratejobs_overview")
DATA_URL = reverse("ratejobs_overview_data")


def run_job(job: Job, *, succeeded: int = 0, failed: int = 0) -> Job:
    """The job as a worker leaves it while it runs: counters, and its calls' seconds."""
    job.status = Job.Status.RUNNING
    job.started = timezone.now() - timedelta(seconds=30)
    job.succeeded, job.failed = succeeded, failed
    job.save()
    return job


def data(client: Any) -> dict[str, Any]:
    response = client.get(DATA_URL)
    assert response.status_code == 200
    return response.json()


def api_data(payload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for row in payload["apis"] if row["name"] == name)


def kinds(payload: dict[str, Any]) -> list[str]:
    return [item["kind"] for item in payload["attention"]]


def test_the_page_is_for_staff_only(client, admin_client_for, staff, user):
    for url in (PAGE_URL, DATA_URL):
        assert client.get(url).status_code == 302  # to the admin's login
        assert admin_client_for(user).get(url).status_code == 302  # signed in, not staff
    html = admin_client_for(staff).get(PAGE_URL).content.decode()
    assert 'id="rj-overview"' in html and f'data-data-url="{DATA_URL}"' in html
    for part in ('id="rj-overview-apis"', 'id="rj-overview-jobs"', 'id="rj-attention"'):
        assert part in html
    assert '<li data-kind="none">Nothing needs attention.</li>' in html
    assert "ratejobs/overview.js" in html


def test_the_admin_index_is_the_overview_and_the_app_page_links_to_it(root_client):
    # the project's admin is the console (ratejobs.console): its home is the overview itself
    html = root_client.get(reverse("admin:index")).content.decode()
    assert 'id="rj-overview"' in html and f'href="{PAGE_URL}"' in html
    html = root_client.get(reverse("admin:app_list", args=["ratejobs"])).content.decode()
    assert "Overview: what every API and job is doing now" in html
    assert f'href="{PAGE_URL}"' in html


def test_figures_of_the_last_five_minutes_come_from_seconds_and_429s(
    root_client, make_api, make_job
):
    # given an API of 20/s, a running job with 12 calls ended over two seconds 20 s ago and
    # one 6 minutes ago, and three 429s now and one too old to count
    api = make_api(rate=20.0, max_concurrency=10)
    job = run_job(make_job(calls=40, api=api), succeeded=13)
    now = database_now().replace(microsecond=0)
    JobSecond.objects.bulk_create([
        JobSecond(job=job, at=now - timedelta(seconds=20), calls=7),
        JobSecond(job=job, at=now - timedelta(seconds=19), calls=5),
        JobSecond(job=job, at=now - timedelta(seconds=360), calls=1),
    ])  # fmt: skip
    for _ in range(3):
        ThrottleEvent.objects.create(api=api, job=job, kind="throttled", status_code=429)
    old = ThrottleEvent.objects.create(api=api, job=job, kind="throttled", status_code=429)
    ThrottleEvent.objects.filter(pk=old.pk).update(created=now - timedelta(minutes=6))

    payload = data(root_client)
    row = api_data(payload, api.name)
    assert row["current_rate"] == "20.0/s of 20/s"
    assert row["in_flight"] == "0 of 10"
    assert row["blocked"] == "—" and row["blocked_for"] == 0
    assert row["throttles_5m"] == 3
    # calls that ended, with their 429s counted apart (they are attempts, not calls)
    assert (row["calls_finished_5m"], row["requests_5m"]) == (12, 12 + 3)
    assert (row["calls_finished_5m_text"], row["throttles_5m_text"]) == ("12 calls", "3 × 429")
    assert len(row["calls_per_second"]) == TRAFFIC_BUCKETS
    assert sum(row["calls_per_second"]) * 10 == 12
    assert sum(row["throttled"]) == 3 and row["throttled"][-1] == 3  # in the newest bucket
    [job_row] = [j for j in payload["jobs"] if j["id"] == job.pk]
    assert (job_row["done"], job_row["total"], job_row["status"]) == (13, 40, "running")
    assert job_row["pace_text"].endswith("/s") and job_row["eta"] != "—"
    html = payload["html"]["apis"]
    assert f'<tr data-api="{api.name}">' in html and 'class="rj-sparkline"' in html
    assert 'class="rj-429"' in html
    assert f'<tr data-job="{job.pk}"' in payload["html"]["jobs"]
    assert 'class="rj-progress"' in payload["html"]["jobs"]


def test_a_window_says_what_is_left_of_it(root_client, make_api):
    api = make_api(limits=[{"rate": 300, "period": 60, "burst": 300}])
    assert api_data(data(root_client), api.name)["windows"] == ["300 of 300 per 60 s left"]


def test_a_blocked_api_says_until_when_and_why(root_client, make_api, make_job):
    api = make_api()
    api_block(api=api, seconds=30)
    payload = data(root_client)
    row = api_data(payload, api.name)
    assert row["blocked"].startswith("blocked until ") and row["blocked"].endswith("s)")
    assert 25 < row["blocked_for"] <= 30
    assert 'data-field="blocked" class="rj-blocked"' in payload["html"]["apis"]
    [blocked] = [item for item in payload["attention"] if item["kind"] == "blocked"]
    assert api.name in blocked["text"] and "manual block for 30 s by an operator" in blocked["text"]


def test_a_silent_worker_needs_attention_only_while_jobs_wait(root_client, make_job):
    seen = database_now() - timedelta(minutes=5)
    WorkerProcess.objects.create(owner="h:1:a", host="h", pid=1, started=seen, seen_at=seen)
    assert "workers" not in kinds(data(root_client))  # nothing to run
    make_job()  # queued
    payload = data(root_client)
    [workers] = [item for item in payload["attention"] if item["kind"] == "workers"]
    assert "No worker seen since" in workers["text"] and "5 min" in workers["text"]
    WorkerProcess.objects.update(seen_at=database_now())
    assert "workers" not in kinds(data(root_client))


def test_failed_and_stuck_calls_need_attention(root_client, make_job):
    job = run_job(make_job(calls=4, name="nightly"), succeeded=1, failed=2)
    # a call whose claim ran out a minute ago and nobody took back
    Call.objects.filter(job=job, index=3).update(
        status="running",
        claim_owner="gone:1:x",
        running_until=database_now() - timedelta(minutes=1),
    )
    payload = data(root_client)
    assert "workers" in kinds(payload)  # a running job and no worker ever seen
    [failures] = [item for item in payload["attention"] if item["kind"] == "failures"]
    assert "nightly" in failures["text"] and "2 failed calls" in failures["text"]
    assert f"job={job.pk}&amp;outcome=failed" in payload["html"]["attention"]
    [stuck] = [item for item in payload["attention"] if item["kind"] == "stuck"]
    assert stuck["text"].startswith(f"{job.api.name}: 1 call running past their claim")
    assert "workers' sweep" in stuck["text"]  # text as read, not HTML


def test_staff_see_only_their_own_jobs(admin_client_for, staff, make_job):
    mine = run_job(make_job(owner=staff, name="mine"), failed=1)
    theirs = run_job(make_job(name="theirs"), failed=1)
    payload = data(admin_client_for(staff))
    assert [job["id"] for job in payload["jobs"]] == [mine.pk]
    assert "theirs" not in payload["html"]["attention"]
    assert f'data-job="{theirs.pk}"' not in payload["html"]["jobs"]


def test_the_page_works_while_redis_is_down(root_client, make_api, make_job, request):
    api = make_api()
    make_job(api=api)
    request.getfixturevalue("redis_down")  # only now: the API's limiter was set up
    assert 'id="rj-overview"' in root_client.get(PAGE_URL).content.decode()
    payload = data(root_client)
    row = api_data(payload, api.name)
    assert row["current_rate"].startswith("limiter state unavailable")
    assert row["in_flight"] == "—" and row["blocked"] == "—"
    assert len(payload["jobs"]) == 1


def test_queries_do_not_grow_with_apis_and_jobs(
    root_client, make_api, make_job, django_assert_max_num_queries
):
    made: list[str] = []

    def make_busy_api() -> None:
        api = make_api()
        made.append(api.name)
        job = run_job(make_job(calls=2, api=api), failed=1)
        JobSecond.objects.create(job=job, at=database_now().replace(microsecond=0), calls=1)
        ThrottleEvent.objects.create(api=api, job=job, kind="throttled", status_code=429)
        api_block(api=api, seconds=30)

    make_busy_api()
    with CaptureQueriesContext(connection) as one:
        data(root_client)
    for _ in range(4):
        make_busy_api()
    with django_assert_max_num_queries(len(one)):
        payload = data(root_client)
    assert {row["name"] for row in payload["apis"]} >= set(made) and len(payload["jobs"]) == 5
    assert kinds(payload).count("blocked") == 5


def test_more_jobs_than_shown_are_counted(root_client, api, user):
    Job.objects.bulk_create(
        Job(owner=user, api=api, name=f"job {i}", total=10, status="running") for i in range(53)
    )
    payload = data(root_client)
    assert len(payload["jobs"]) == 50 and payload["jobs_not_shown"] == 3
    assert "and 3 more" in payload["html"]["jobs"]
