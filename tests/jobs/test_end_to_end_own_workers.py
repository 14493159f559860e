"""Jobs run end to end with worker processes of their own (the other end-to-end tests share
one, tests/jobs/test_end_to_end.py): pool processes killed with -9, a Redis that restarts with
nothing persisted, a worker logging JSON."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from devtools.devredis import start_private_redis
from ratejobs.models import Api, Call, Job, ThrottleEvent
from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create
from tests.realparts import wait_for_job

pytestmark = pytest.mark.django_db(transaction=True)

# Workers that find a killed process dead in 4 s instead of the test settings' 10 s (heartbeat
# every 0.5 s, sweep every 1 s): the same take-back, seconds sooner. Eight missed heartbeats,
# so a live process on a loaded machine is not taken for dead (its calls would be sent twice).
QUICK_DEATH = {"RATEJOBS_WORKER_HEARTBEAT_SECONDS": "0.5", "RATEJOBS_WORKER_DEAD_AFTER": "4"}


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("owner", password="x")


# Room for the start (up to a minute on a loaded machine) and the 90 s wait for the job, so
# that a job that hangs fails with the wait's account of its calls, not pytest-timeout's stacks.
@pytest.mark.timeout(180)
@pytest.mark.parametrize("idempotency_header", ["", "Idempotency-Key"])
def test_job_completes_when_a_worker_process_is_killed_mid_job(
    owner, sandbox, start_worker, unique_name, idempotency_header
):
    # given slow responses, so that every call left is held by the two pool processes (in
    # flight, or claimed and waiting for its slot) when both are killed with -9: the broker
    # is empty, and only the new pool processes' sweep can give those calls back; and with an
    # idempotency header, a key on every call, which the sandbox honours as Stripe does
    server = sandbox(rate=1000, burst=50, latency=1.0, headers="none")
    api = api_create(
        name=unique_name,
        base_url=server.url,
        rate=50,
        burst=5,
        idempotency_header=idempotency_header,
    )
    worker = start_worker(concurrency=2, **QUICK_DEATH)
    job = job_create(
        owner=owner,
        api=api,
        name="kill -9",
        calls=[{"method": "GET", "path": f"/items/{i}"} for i in range(60)],
    )
    deadline = time.monotonic() + 60
    while not Call.objects.filter(job=job, status="succeeded").exists():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    victims = worker.pool_pids()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    # expect: the dead processes' calls are taken back once their heartbeats stop, and every
    # call ends final exactly once (the wait ends before the test's timeout, to say why)
    job = wait_for_job(job, timeout=90, worker=worker)
    statuses = Counter(Call.objects.filter(job=job).values_list("status", flat=True))
    stats = server.stats()
    counts = {name: stats[name] for name in ("arrivals", "idempotent_replays", "unique_keys")}
    print(f"killed {victims}; statuses {dict(statuses)}; sandbox {counts}")
    assert statuses == {"succeeded": 60}
    assert (job.succeeded, job.failed, job.cancelled) == (60, 0, 0)
    if idempotency_header:
        # and the calls that were in flight, sent again, got their first answer: the API
        # acted on every call once (no effective duplicate)
        assert stats["arrivals"] == stats["unique_keys"] == 60
        assert stats["idempotent_replays"] >= 1


def test_a_canary_secret_never_leaks_into_the_database_logs_or_task_arguments(
    owner, sandbox, start_worker, unique_name, caplog
):
    # given an API whose credential is a canary string, and a job that gets some 429s, run by
    # a worker that logs JSON (at twice the sandbox's rate, most calls meet a 429 or a spent
    # quota's block of up to a second: 6 calls take about 5 s)
    canary = "canary-" + unique_name
    server = sandbox(rate=5, burst=1, headers="github")
    api = api_create(
        name=unique_name, base_url=server.url, rate=10, burst=2, credential=f"Bearer {canary}"
    )
    worker = start_worker(concurrency=2, RATEJOBS_LOG_FORMAT="json")
    job = job_create(
        owner=owner,
        api=api,
        name="canary",
        calls=[{"method": "POST", "path": f"/items/{i}", "json": {"i": i}} for i in range(6)],
    )
    wait_for_job(job, timeout=120)
    # expect: the secret is in no column of any row, no worker log line, no task message
    with connection.cursor() as cursor:
        for model in (Api, Job, Call, ThrottleEvent):
            cursor.execute(f"SELECT * FROM {model._meta.db_table}")
            dump = repr(cursor.fetchall())
            assert canary not in dump, model.__name__
    assert canary not in worker.log.read_text()
    assert "ratejobs.execute_calls" in worker.log.read_text()
    assert canary not in caplog.text
    # and each 429 made one JSON log line naming its API, job and call
    lines = [json.loads(line) for line in worker.log.read_text().splitlines() if line.strip()]
    decisions = [line for line in lines if line["message"].startswith("throttle decision")]
    throttled = [line for line in decisions if line["status_code"] == 429]
    job.refresh_from_db()
    assert job.throttled > 0
    assert len(throttled) == job.throttled
    calls = set(Call.objects.filter(job=job).values_list("pk", flat=True))
    for line in decisions:
        assert (line["level"], line["api"], line["job_id"]) == ("INFO", api.name, job.pk)
        assert line["call_id"] in calls


def test_job_completes_after_redis_restarts_mid_job_with_nothing_persisted(
    owner, sandbox, start_worker, start_beat, unique_name
):
    # given workers and beat on a private Redis (broker and limiter) that keeps nothing on disk
    redis_server = start_private_redis()
    port = urlsplit(redis_server.url).port
    env = {
        "REDIS_URL": redis_server.url,
        "CELERY_BROKER_URL": redis_server.url,
        "RATEJOBS_RECONCILE_INTERVAL": "2",
        "RATEJOBS_STALE_DISPATCH_SECONDS": "3",
    }
    try:
        server = sandbox(rate=100, burst=10, latency=0.05, headers="none")
        api = api_create(name=unique_name, base_url=server.url, rate=25, burst=2)
        # 4 s of calls at 25/s: when Redis goes, after 40 of them, the broker holds about the
        # next 2 s of them (the dispatch window), which the restart loses
        calls = 100
        worker = start_worker(concurrency=2, **env)
        start_beat(**env)
        job = job_create(
            owner=owner,
            api=api,
            name="redis restart",
            calls=[{"method": "GET", "path": f"/items/{i}"} for i in range(calls)],
        )
        deadline = time.monotonic() + 60
        while Call.objects.filter(job=job, status="succeeded").count() < 40:
            assert time.monotonic() < deadline, "the job did not get going"
            time.sleep(0.1)
        # when Redis goes away mid-job and comes back empty
        redis_server.stop()
        time.sleep(1.0)
        redis_server = start_private_redis(port=port)
        # expect: the worker survives the loss. Celery 5.7 closes the lost connection after
        # detaching its transport, and kombu's restore of the unacknowledged (acks_late)
        # messages then fails with an AttributeError that would end the main process
        # ("Unrecoverable error"), at once or seconds later; ratejobs' consumer
        # (ratejobs/worker/consumer.py) keeps that from ending the worker.
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            assert worker.process.poll() is None, _worker_died(worker)
            if Job.objects.get(pk=job.pk).status in ("completed", "cancelled"):
                break
            time.sleep(0.5)
        # and the reconciler finds what was lost and the job completes, nothing lost
        job = wait_for_job(job, timeout=1, worker=worker)
        statuses = Counter(Call.objects.filter(job=job).values_list("status", flat=True))
        print(f"after the restart: {dict(statuses)}; sandbox arrivals {server.stats()['arrivals']}")
        assert statuses == {"succeeded": calls}
        assert job.succeeded == calls
        assert worker.process.poll() is None, _worker_died(worker)
        assert "Unrecoverable error" not in worker.log.read_text(errors="replace")
    finally:
        redis_server.stop()


def _worker_died(worker) -> str:
    log = worker.log.read_text(errors="replace")
    return f"the worker's main process died on the broker loss:\n{log[-3000:]}"
