"""The engine: one worker process carries many calls at once, with at most two
database connections, and a call waiting for an in-flight place goes when one is released.
Real parts: a Celery worker started with the plain command, the sandbox, PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections

from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create
from tests.realparts import wait_for_job

pytestmark = pytest.mark.django_db(transaction=True)


class ConnectionCount:
    """The most PostgreSQL connections seen with one application_name, sampled in a thread."""

    def __init__(self, application_name: str) -> None:
        self.name, self.most = application_name, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with connections["default"].cursor() as cursor:
            while not self._stop.wait(0.1):
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    [self.name],
                )
                self.most = max(self.most, cursor.fetchone()[0])
        connections["default"].close()

    def __enter__(self) -> ConnectionCount:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("engine-owner", password="x")


def test_one_process_carries_many_calls_at_once_with_two_database_connections(
    owner, sandbox, start_worker, unique_name
):
    # given a slow API (0.5 s per response) with no limit worth the name, and ONE worker process
    server = sandbox(no_limit=True, latency=0.5, headers="none")
    api = api_create(name=unique_name, base_url=server.url, rate=1000, burst=50)
    app_name = f"ratejobs-test-{uuid.uuid4().hex[:8]}"
    start_worker(concurrency=1, PGAPPNAME=app_name, RATEJOBS_CALLS_IN_FLIGHT="24")
    # when a job of 96 calls runs
    postgres = connection.vendor == "postgresql"
    with ConnectionCount(app_name) if postgres else contextlib.nullcontext() as seen:
        job = job_create(
            owner=owner, api=api, name="many", calls=[{"path": f"/m/{i}"} for i in range(96)]
        )
        job = wait_for_job(job, timeout=120)
    in_flight = server.most_in_flight()
    print(f"most in flight {in_flight}; database connections {getattr(seen, 'most', 'n/a')}")
    # expect: every call once, up to the 24 places of the one process in flight together
    assert (job.status, job.succeeded) == ("completed", 96)
    assert server.stats()["arrivals"] == 96
    assert 16 <= in_flight <= 24
    # and the process used at most two database connections (its tasks' and its recorder's)
    if postgres:
        assert 1 <= seen.most <= 2


def test_a_call_waiting_for_an_in_flight_place_goes_when_one_is_released(
    owner, sandbox, start_worker, unique_name
):
    # given an API allowing 2 calls in flight, answering in 1 s, and 2 worker processes
    server = sandbox(no_limit=True, latency=1.0, headers="none")
    api = api_create(name=unique_name, base_url=server.url, rate=100, burst=5, max_concurrency=2)
    start_worker(concurrency=2)
    # when 10 calls run (5 rounds of 2: about 5 s)
    job = job_create(
        owner=owner, api=api, name="capped", calls=[{"path": f"/c/{i}"} for i in range(10)]
    )
    # expect: they finish long before a lease would expire (lease ~100 s; the first path
    # parked each waiting call that long), never more than 2 in flight, each sent once
    job = wait_for_job(job, timeout=60)
    assert (job.status, job.succeeded) == ("completed", 10)
    assert server.stats()["arrivals"] == 10
    assert server.most_in_flight() <= 2
