"""Each attempt of a call is kept: written by a real worker with the call's outcome, with the
throttle headers that mattered and nothing secret; removed by retention with the bodies and by a
job's purge."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ratejobs.models import Call, CallAttempt, Job
from ratejobs.services.apis import api_create
from ratejobs.services.calls import (
    Finished,
    call_attempt,
    calls_claim,
    calls_record_outcomes,
    calls_slot_too_far,
    throttle_headers,
)
from ratejobs.services.jobs import job_create, job_retry_failed
from ratejobs.services.retention import (
    call_bodies_remove_old,
    job_purge,
    job_purge_request,
    jobs_purge_requested,
)
from tests.realparts import wait_for_job

CREDENTIAL = "attempts-canary-credential-7f3a"
DEFAULT_HEADER_SECRET = "attempts-canary-default-header-91c2"


def _attempt(call: Call, number: int, **fields: Any) -> CallAttempt:
    now = timezone.now()
    values = {"outcome": "succeeded", "started": now, "finished": now, "status_code": 200}
    return CallAttempt.objects.create(
        job_id=call.job_id, call=call, number=number, **{**values, **fields}
    )


def _attempts_of(job: Job) -> None:
    """Two attempts per call of `job`: a 429, then the 200."""
    for call in Call.objects.filter(job=job):
        _attempt(call, 1, outcome="throttled", status_code=429, throttled=True, retry_after="1")
        _attempt(call, 2)


@pytest.mark.django_db(transaction=True)
def test_a_call_throttled_then_answered_keeps_both_attempts_and_no_secret(
    sandbox, shared_worker, unique_name
):
    # given a sandbox taking one request per 2 s with GitHub's rate-limit headers, an API
    # configured far faster with a credential and a secret default header, and two calls sent
    # together: the second to arrive is throttled, with a Retry-After, and answered after it
    owner = get_user_model().objects.create_user("owner", password="x")
    server = sandbox(rate=1, period=2, burst=1, headers="github")
    api = api_create(
        name=unique_name,
        base_url=server.url,
        rate=50,
        burst=2,
        credential=CREDENTIAL,
        default_headers={"X-Team-Token": DEFAULT_HEADER_SECRET},
    )
    calls = [{"method": "GET", "path": f"/items/{i}"} for i in range(2)]
    job = job_create(owner=owner, api=api, name="throttled once", calls=calls)
    job = wait_for_job(job, timeout=90, worker=shared_worker)
    assert (job.status, job.succeeded) == ("completed", 2)

    # expect: the throttled call has its two attempts, the 429 with its Retry-After first
    throttled = Call.objects.get(job=job, throttled_count=1)
    attempts = list(CallAttempt.objects.filter(call=throttled).order_by("finished", "pk"))
    shown = [(a.number, a.status_code, a.outcome, a.throttled) for a in attempts]
    assert shown == [(1, 429, "throttled", True), (2, 200, "succeeded", False)]
    first, last = attempts
    assert first.retry_after.isdigit() and int(first.retry_after) >= 1
    assert first.throttle_headers["retry-after"] == first.retry_after
    assert "x-ratelimit-remaining" in first.throttle_headers
    assert first.retry_in is not None and first.retry_in > 0
    assert last.retry_in is None  # final: no next try
    # in order, each dated on the database's clock within the call's own time
    assert first.started <= first.finished <= last.started <= last.finished
    assert throttled.started <= first.started and last.finished <= throttled.finished
    assert first.duration is not None and first.duration >= 0
    # and the other call, answered at its first try, keeps no row: the call's own is that try
    other = Call.objects.exclude(pk=throttled.pk).get(job=job)
    assert (other.attempts, other.status_code) == (1, 200)
    assert not other.attempt_records.exists()
    assert CallAttempt.objects.filter(job=job).count() == 2
    # and nothing secret is kept: no credential, request header or response body
    stored = json.dumps(list(CallAttempt.objects.filter(job=job).values()), default=str)
    for secret in (CREDENTIAL, DEFAULT_HEADER_SECRET, "Authorization", "x-team-token"):
        assert secret.lower() not in stored.lower()
    body = bytes(Call.objects.get(pk=other.pk).response_body or b"")
    assert body and body.decode() not in stored


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("services_redis")
def test_a_batch_of_outcomes_writes_its_attempts_in_one_statement(sandbox, unique_name):
    # given 20 calls of a job sent against the sandbox in this thread, as a worker's do, each
    # on its second try (a first try that is also the last keeps no row of its own)
    owner = get_user_model().objects.create_user("batch", password="x")
    server = sandbox(rate=1000, burst=100, headers="github")
    api = api_create(name=unique_name, base_url=server.url, rate=1000, burst=100)
    calls = [{"method": "GET", "path": f"/items/{i}"} for i in range(21)]
    job = job_create(owner=owner, api=api, name="batch", calls=calls)
    Call.objects.filter(job=job).update(dispatched_at=timezone.now(), attempts=1)
    ids = Call.objects.filter(job=job).values_list("pk", flat=True)
    claims = calls_claim(job_id=job.pk, call_ids=ids, owner="test")
    finished = [Finished(c, call_attempt(c)) for c in claims[:20]]
    # and one call whose slot was too far: it waited, nothing was sent
    waited = replace(claims[20], slot_in=30.0)
    finished.append(Finished(waited, calls_slot_too_far(waited)))
    # when the recorder writes their outcomes
    with CaptureQueriesContext(connection) as queries:
        assert calls_record_outcomes(finished) == 21
    # expect: the 20 attempts in one INSERT of the same transaction, none for the wait
    table = CallAttempt._meta.db_table
    inserts = [q["sql"] for q in queries.captured_queries if f'INSERT INTO "{table}"' in q["sql"]]
    assert len(inserts) == 1
    assert CallAttempt.objects.filter(job=job).count() == 20
    assert not CallAttempt.objects.filter(call_id=claims[20].call.pk).exists()
    assert set(CallAttempt.objects.filter(job=job).values_list("number", "status_code")) == {
        (2, 200)
    }


def test_only_the_headers_the_limiter_reads_are_kept():
    headers = {
        "Retry-After": "3",
        "X-RateLimit-Remaining": "0",
        "RateLimit-Policy": '"default";q=10;w=1',
        "Set-Cookie": "session=secret",
        "Authorization": "Bearer secret",
        "X-Request-Id": "abc",
        "Content-Type": "application/json",
    }
    assert throttle_headers(headers) == {
        "retry-after": "3",
        "x-ratelimit-remaining": "0",
        "ratelimit-policy": '"default";q=10;w=1',
    }
    # a server sending many is kept to a few, each cut short
    many = {f"X-RateLimit-Extra-{i}": "9" * 1000 for i in range(100)}
    kept = throttle_headers(many)
    assert len(kept) == 20 and all(len(value) == 200 for value in kept.values())


@pytest.mark.django_db
@pytest.mark.usefixtures("services_redis")
def test_retention_removes_attempts_with_the_bodies_and_keeps_younger_ones(finished_job):
    # given an old and a recent job, two attempts per call each
    old = finished_job(calls=3, age_days=40)
    recent = finished_job(calls=2, age_days=10)
    _attempts_of(old)
    _attempts_of(recent)
    # expect: the old job's 6 attempts go, 4 at a time, with its bodies; the recent ones stay
    removed = call_bodies_remove_old(days=30, batch_size=4)
    assert removed.done
    assert not CallAttempt.objects.filter(job=old).exists()
    assert CallAttempt.objects.filter(job=recent).count() == 4
    assert removed.rows == 6 + 3  # attempts, then bodies
    assert removed.batches == 2 + 1  # 4 + 2 attempts, then 3 calls in one index range


@pytest.mark.django_db
@pytest.mark.usefixtures("services_redis")
def test_retention_keeps_the_attempts_of_a_job_running_again(finished_job):
    # given an old job whose failed call was sent again, so it is running
    job = finished_job(calls=2, age_days=40)
    _attempts_of(job)
    Call.objects.filter(job=job, index=0).update(status=Call.Status.FAILED)
    Job.objects.filter(pk=job.pk).update(failed=1, succeeded=1)
    job_retry_failed(job=job)
    # expect: nothing of it removed
    call_bodies_remove_old(days=30)
    assert CallAttempt.objects.filter(job=job).count() == 4


@pytest.mark.django_db
@pytest.mark.usefixtures("services_redis")
def test_a_purge_deletes_the_attempts_and_nothing_of_other_jobs(finished_job):
    job = finished_job(calls=3)
    other = finished_job(calls=2)
    _attempts_of(job)
    _attempts_of(other)
    removed = job_purge(job=job, batch_size=4)
    assert removed.done
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not CallAttempt.objects.filter(job_id=job.pk).exists()
    assert CallAttempt.objects.filter(job=other).count() == 4


@pytest.mark.django_db
@pytest.mark.usefixtures("services_redis")
def test_a_requested_purge_deletes_the_attempts(finished_job):
    job = finished_job(calls=2)
    _attempts_of(job)
    job_purge_request(job=job)
    assert jobs_purge_requested().done
    assert not CallAttempt.objects.filter(job_id=job.pk).exists()
    assert not Call.objects.filter(job_id=job.pk).exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("services_redis")
def test_old_attempts_are_removed_by_retention_only_once_the_job_is_old(finished_job):
    job = finished_job(calls=1, age_days=29)
    _attempts_of(job)
    assert call_bodies_remove_old(days=30).rows == 0
    Job.objects.filter(pk=job.pk).update(finished=timezone.now() - timedelta(days=31))
    assert call_bodies_remove_old(days=30).rows == 2 + 1
    assert not CallAttempt.objects.filter(job=job).exists()
