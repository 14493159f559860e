"""The admin at scale: a 100,000-row upload is streamed, and a page of 100 jobs stays fast
with 1,000,000 calls in the database. Timings are printed, not asserted tightly."""

from __future__ import annotations

import json
import resource
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ratejobs.models import Call, Job

ROWS = 100_000


@pytest.mark.slow
def test_an_upload_of_100000_rows_is_stored_without_holding_it_in_memory(root_client, api):
    # given a JSONL file of 100,000 calls (about 4 MB)
    data = "".join(
        json.dumps({"path": f"/items/{i}", "query": {"n": i}}) + "\n" for i in range(ROWS)
    )
    upload = SimpleUploadedFile("calls.jsonl", data.encode())
    # when it is submitted through the admin
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    started = time.perf_counter()
    response = root_client.post(
        reverse("admin:ratejobs_job_add"),
        {"api": api.pk, "name": "big", "priority": 1, "calls_file": upload},
    )
    elapsed = time.perf_counter() - started
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    # expect: every call stored, and the process's peak memory grew far less than holding the
    # calls at once takes (a Call object with its dicts is over 1 KB: 100 MB and more)
    assert response.status_code == 302
    assert Job.objects.get().total == ROWS == Call.objects.count()
    print(f"\n100,000-row upload: {elapsed:.1f} s, peak memory grew {growth / 2**20:.1f} MiB")
    assert growth < 60 * 2**20


def insert_calls(job_ids: list[int], per_job: int) -> None:
    """Calls made by the database itself: a million through the ORM would take minutes."""
    now = timezone.now()
    columns = (
        'job_id, "index", method, path, status, attempts, throttled_count, claim_token, '
        "claim_owner, response_truncated, error, created, finished, status_code"
    )
    with connection.cursor() as cursor:
        for job_id in job_ids:
            if connection.vendor == "postgresql":
                cursor.execute(
                    f"INSERT INTO ratejobs_call ({columns}) "
                    "SELECT %s, n, 'GET', '/items/' || n, 'succeeded', 1, 0, '', '', false, '', "
                    "%s, %s - (n || ' milliseconds')::interval, 200 "
                    "FROM generate_series(0, %s - 1) AS n",
                    [job_id, now, now, per_job],
                )
            else:
                cursor.execute(
                    f"WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq "
                    f"WHERE n + 1 < %s) INSERT INTO ratejobs_call ({columns}) "
                    "SELECT %s, n, 'GET', '/items/' || n, 'succeeded', 1, 0, '', '', 0, '', %s, "
                    "%s, 200 FROM seq",
                    [per_job, job_id, now.isoformat(" "), now.isoformat(" ")],
                )


@pytest.mark.slow
def test_a_page_of_100_jobs_stays_fast_with_a_million_calls_stored(root_client, make_job):
    # given 100 jobs of 10,000 finished calls each (1,000,000 calls)
    jobs = [make_job(calls=1, name=f"job {i}") for i in range(100)]
    Call.objects.all().delete()
    started = time.perf_counter()
    insert_calls([job.pk for job in jobs], 10_000)
    Job.objects.update(total=10_000, succeeded=10_000, status="running", started=timezone.now())
    print(f"\ninserted 1,000,000 calls in {time.perf_counter() - started:.1f} s")
    assert Call.objects.count() == 1_000_000
    # when the job list is shown, sorted by progress, and one job's page
    url = reverse("admin:ratejobs_job_changelist")
    timings = {}
    for name, params in (("list", {}), ("list by progress", {"o": "5"})):
        started = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            response = root_client.get(url, params)
        timings[name] = (time.perf_counter() - started, len(queries))
        assert response.status_code == 200
        assert response.content.decode().count('class="rj-progress"') == 100
    started = time.perf_counter()
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[jobs[0].pk]))
    timings["job page"] = (time.perf_counter() - started, None)
    assert page.status_code == 200
    print("; ".join(f"{name}: {s * 1000:.0f} ms, {q} queries" for name, (s, q) in timings.items()))
    # expect: a bounded number of queries, and seconds at worst even on a busy machine
    assert all(q is None or q <= 12 for _, q in timings.values())
    assert all(seconds < 10 for seconds, _ in timings.values())
