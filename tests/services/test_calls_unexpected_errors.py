"""Errors nobody planned for end as recorded attempts with their error, a bounded number of
times, and then the call fails: never a RUNNING -> PENDING loop that leaves no trace.
Real parts: a Redis that became a read-only replica (as after a failover), a real HTTP server
on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from devtools import devredis
from ratejobs.models import Api, Call
from ratejobs.services.calls import call_attempt_by_id
from ratejobs.services.jobs import job_create
from tests.conftest import _forget_redis_clients

MAX_ATTEMPTS = 3


@pytest.fixture
def private_redis(db: None) -> Iterator[redis.Redis]:
    """The services' Redis is a private server of our own, for the test to break."""
    server = devredis.ensure(f"redis://127.0.0.1:{devredis.free_port()}/0")
    real = settings.REDIS_URL
    settings.REDIS_URL = server.url
    _forget_redis_clients()
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()
    settings.REDIS_URL = real
    _forget_redis_clients()
    server.stop()


def run_until_final(call: Call, *, rounds: int) -> list[str]:
    """Run the call as a worker would, each time it is due again (its backoff skipped)."""
    kinds = []
    for _ in range(rounds):
        Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now(), next_attempt_at=None)
        kinds.append(call_attempt_by_id(call_id=call.pk))
        call.refresh_from_db()
        if call.status in Call.FINAL:
            break
    return kinds


def test_a_redis_error_the_limiter_cannot_place_is_a_recorded_attempt_then_a_failure(
    private_redis: redis.Redis, http_server: Any, marker: str, make_api: Any, user: Any
):
    # given an API whose limiter is configured, then its Redis turned into a read-only replica
    # (of a master that is not there), as a failover can leave it: every write gets READONLY
    api = make_api(base_url=http_server.base, max_attempts=MAX_ATTEMPTS, credential="")
    private_redis.replicaof("127.0.0.1", devredis.free_port())
    job = job_create(owner=user, api=api, name="oom", calls=[{"path": f"/echo/{marker}"}])
    call = Call.objects.get(job=job)

    kinds = run_until_final(call, rounds=MAX_ATTEMPTS + 2)

    # expect: one recorded attempt per run, each with its error, and a failure at the bound
    assert kinds == ["retry"] * (MAX_ATTEMPTS - 1) + ["failed"]
    assert call.status == "failed" and call.attempts == MAX_ATTEMPTS
    assert "read only replica" in call.error
    assert f"gave up after {MAX_ATTEMPTS} attempts" in call.error
    assert job.calls.filter(status="running").count() == 0
    assert http_server.requests_with(marker) == []  # the limiter failed closed: nothing sent


def test_a_request_the_http_client_refuses_fails_at_once_with_its_error(
    user: Any, unique_name: str
):
    # given a job on an API whose base URL was stored before it was checked this way (a host
    # with an empty label, which the HTTP client refuses to send to)
    api = Api.objects.create(name=unique_name, base_url="http://example.com/v1", rate=10)
    job = job_create(owner=user, api=api, name="odd", calls=[{"path": "/x"}])
    Api.objects.filter(pk=api.pk).update(base_url="http://ex..ample.com/v1")
    call = Call.objects.get(job=job)

    kinds = run_until_final(call, rounds=3)

    assert kinds == ["failed"] and call.status == "failed"
    assert "not a valid host name" in call.error


@pytest.mark.parametrize("url", ["http://ex..ample.com/v1", f"https://{'a' * 64}.example/"])
def test_a_base_url_the_http_client_cannot_send_to_is_refused_when_saved(
    client_for: Any, manager: Any, unique_name: str, url: str
):
    payload = {"name": unique_name, "base_url": url, "rate": 1}
    response = client_for(manager).post("/api/apis/", payload, format="json")
    assert response.status_code == 400 and "base_url" in response.json()
