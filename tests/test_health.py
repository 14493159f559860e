"""`/healthz` at the real boundary: the database, the limiter's Redis and the broker are
required (503 without them), the workers only when RATEJOBS_HEALTH_REQUIRE_WORKERS says so;
each part has its own status, and a dead Redis is reported quickly, not waited for."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from ratejobs.infra.clock import database_now
from ratejobs.models import WorkerProcess

pytestmark = pytest.mark.usefixtures("services_redis")


def seen_worker(seconds_ago: float) -> WorkerProcess:
    seen = database_now() - timedelta(seconds=seconds_ago)
    return WorkerProcess.objects.create(
        owner=f"host:1:{seconds_ago}", host="host", pid=1, started=seen, seen_at=seen
    )


def health(client) -> tuple[int, dict]:
    response = client.get("/healthz")
    assert response["Content-Type"] == "application/json"
    return response.status_code, response.json()


def test_everything_up_and_a_worker_seen_is_ok(client, settings):
    seen_worker(seconds_ago=5)
    seen_worker(seconds_ago=20)
    status, body = health(client)
    assert (status, body["status"], body["namespace"]) == (200, "ok", settings.RATEJOBS_NAMESPACE)
    checks = body["checks"]
    assert {name: part["status"] for name, part in checks.items()} == {
        "database": "ok",
        "redis": "ok",
        "broker": "ok",
        "workers": "ok",
    }
    assert checks["workers"]["seen_last_minute"] == 2
    assert 0 <= checks["database"]["ms"] < 1000 and 0 <= checks["redis"]["ms"] < 1000


def test_no_worker_seen_in_the_last_minute_is_degraded_unless_workers_are_required(
    admin_client, settings
):
    seen_worker(seconds_ago=90)  # gone, not late
    status, body = health(admin_client)
    assert (status, body["status"]) == (200, "degraded")
    assert body["checks"]["workers"]["status"] == "down"
    assert body["checks"]["workers"]["seen_last_minute"] == 0
    assert "no worker process seen in the last 60 s" in body["checks"]["workers"]["error"]
    settings.RATEJOBS_HEALTH_REQUIRE_WORKERS = True
    status, body = health(admin_client)
    assert (status, body["status"]) == (503, "down")
    assert body["checks"]["workers"]["required"] is True


def test_a_dead_redis_is_a_503_naming_redis_and_answers_quickly(client, admin_client, redis_down):
    seen_worker(seconds_ago=5)
    started = time.monotonic()
    status, body = health(admin_client)
    assert time.monotonic() - started < 3.0
    assert (status, body["status"]) == (503, "down")
    redis_check = body["checks"]["redis"]
    assert redis_check["status"] == "down" and "ConnectionError" in redis_check["error"]
    # an anonymous prober gets the same statuses, not the driver's message (hosts and ports)
    status, anonymous = health(client)
    assert status == 503
    assert anonymous["checks"]["redis"]["status"] == "down"
    assert "error" not in anonymous["checks"]["redis"]
    assert body["checks"]["database"]["status"] == "ok"
