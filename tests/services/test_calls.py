"""A call's result is written exactly once, however often its task runs."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from project.celery import app
from ratejobs.models import Call
from ratejobs.services.apis import api_create
from ratejobs.services.calls import call_attempt_by_id
from ratejobs.services.jobs import job_cancel, job_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker(redis_url):
    app.conf.broker_url = redis_url
    yield
    app.control.purge()


@pytest.mark.postgresql
def test_a_call_task_delivered_twice_sends_and_records_once(broker, sandbox, unique_name):
    # given one dispatched call, and its message delivered to two workers at the same time
    server = sandbox(rate=100, burst=10, latency=0.2, headers="none")
    owner = get_user_model().objects.create_user("twice", password="x")
    api = api_create(name=unique_name, base_url=server.url, rate=100, burst=10)
    job = job_create(owner=owner, api=api, name="twice", calls=[{"path": "/once"}])
    call = Call.objects.get(job=job)
    Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())
    outcomes: list[str] = []
    runs = [
        threading.Thread(target=lambda: outcomes.append(call_attempt_by_id(call_id=call.pk)))
        for _ in range(2)
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(30)
    # and once more after it finished (a redelivery after a lost acknowledgement)
    outcomes.append(call_attempt_by_id(call_id=call.pk))
    # expect: one request reached the API, one result, counted once
    call.refresh_from_db()
    job.refresh_from_db()
    assert sorted(outcomes) == ["skipped", "skipped", "succeeded"]
    assert server.stats()["arrivals"] == 1
    assert (call.status, call.attempts, job.succeeded, job.status) == (
        "succeeded",
        1,
        1,
        "completed",
    )


@pytest.mark.postgresql
def test_a_call_claimed_while_its_job_is_being_cancelled_is_not_sent(broker, sandbox, unique_name):
    # given a dispatched call, and a cancel that has changed its row but not yet committed
    server = sandbox(rate=100, burst=10, headers="none")
    owner = get_user_model().objects.create_user("racer", password="x")
    api = api_create(name=unique_name, base_url=server.url, rate=100, burst=10)
    job = job_create(owner=owner, api=api, name="race", calls=[{"path": "/never"}])
    call = Call.objects.get(job=job)
    Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())
    cancelled = threading.Event()

    def cancel_and_hold() -> None:
        try:
            with transaction.atomic():
                job_cancel(job=job)
                cancelled.set()
                time.sleep(0.5)  # the claim below waits on this row meanwhile
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_and_hold)
    canceller.start()
    assert cancelled.wait(10)
    # when a worker claims the call at that moment
    outcome = call_attempt_by_id(call_id=call.pk)
    canceller.join(10)
    # expect: the claim sees the committed cancel; nothing sent, the call counted once
    call.refresh_from_db()
    job.refresh_from_db()
    assert outcome == "skipped"
    assert server.stats()["arrivals"] == 0
    assert (call.status, job.cancelled, job.succeeded) == ("cancelled", 1, 0)


@pytest.mark.postgresql
def test_a_call_whose_attempt_ends_in_a_retry_after_its_job_was_cancelled_ends_cancelled(
    broker, sandbox, unique_name
):
    # given a call in flight to a server that answers 500 after a while
    server = sandbox(rate=100, burst=10, latency=0.5, error_rate=1.0, headers="none")
    owner = get_user_model().objects.create_user("retrier", password="x")
    api = api_create(name=unique_name, base_url=server.url, rate=100, burst=10)
    job = job_create(owner=owner, api=api, name="retry", calls=[{"path": "/flaky"}])
    call = Call.objects.get(job=job)
    Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())
    outcomes: list[str] = []
    attempt = threading.Thread(target=lambda: outcomes.append(call_attempt_by_id(call_id=call.pk)))
    attempt.start()
    deadline = time.monotonic() + 10
    while server.stats()["arrivals"] < 1:
        assert time.monotonic() < deadline, "the call was never sent"
        time.sleep(0.02)
    # when the job is cancelled before the 500 comes back
    job_cancel(job=job)
    attempt.join(30)
    # expect: the call is final (cancelled), not left pending for a retry that never comes
    call.refresh_from_db()
    job.refresh_from_db()
    assert outcomes == ["retry"]
    assert (call.status, call.next_attempt_at, job.cancelled, job.status) == (
        "cancelled",
        None,
        1,
        "cancelled",
    )
