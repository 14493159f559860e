"""A quota per credential: calls naming credential keys carry each key's secret and
are paced by each key's own limiter bucket. Real parts: Celery workers started with the plain
command, the sandbox limiting per Authorization value, PostgreSQL and Redis."""

from __future__ import annotations

import hashlib

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from ratejobs.infra.connections import redis_client
from ratejobs.infra.limiters import api_limiter
from ratejobs.limiter.buckets import key_buckets
from ratejobs.models import Api, ApiCredential, Call, Job, ThrottleEvent
from ratejobs.namespace import limiter_key_prefix
from ratejobs.services.apis import api_create, api_limiter_reset, api_update
from ratejobs.services.credentials import credentials_add
from ratejobs.services.jobs import job_create
from tests.realparts import wait_for_job

pytestmark = pytest.mark.django_db(transaction=True)

RATE = 8  # per second, for the API and for each key at the sandbox
# Two seconds of calls per key: the three keys together still fill a second with more than one
# key's bucket allows.
CALLS_PER_KEY = 16
KEYS = ("acme", "globex", "initech")
# Room at the sandbox above the API's burst of 1: its quota headers then never read 0, which
# would block the key's bucket until their reset (as they should: that is the quota hint).
SANDBOX_BURST = 5


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def test_three_keys_run_at_the_rate_each_with_no_429_and_no_secret_anywhere(
    sandbox, start_worker, unique_name
):
    # given a sandbox limiting each Authorization value to RATE/s (burst 5), an API at RATE/s
    # (burst 1) with three customers' credentials, and a job spreading its calls over them:
    # the job's key for a third, the calls' own keys for the rest
    owner = get_user_model().objects.create_user("keys-owner", password="x")
    server = sandbox(
        rate=RATE, burst=SANDBOX_BURST, headers="github", limit_by_header="Authorization"
    )
    api = api_create(name=unique_name, base_url=server.url, rate=RATE, burst=1)
    secrets = {key: f"Bearer canary-{key}-{unique_name}" for key in KEYS}
    credentials_add(api=api, items=secrets.items())
    worker = start_worker(concurrency=2, RATEJOBS_LOG_FORMAT="json")
    calls = [
        {"path": f"/items/{key}/{i}", **({"credential_key": key} if key != KEYS[0] else {})}
        for i in range(CALLS_PER_KEY)
        for key in KEYS
    ]
    job = job_create(owner=owner, api=api, name="per key", calls=calls, credential_key=KEYS[0])
    job = wait_for_job(job, timeout=120)
    stats = server.stats(window=1.0)
    elapsed = (job.finished - job.started).total_seconds()
    total = len(KEYS) * CALLS_PER_KEY
    print(f"{total} calls over 3 keys at {RATE}/s each: {total / elapsed:.1f}/s; {stats}")
    # expect: every call succeeds with no 429; the sandbox saw each key's own Authorization,
    # each within its own limit, and together more than one key's bucket would allow
    assert (job.status, job.succeeded, job.throttled) == ("completed", total, 0)
    assert stats["throttled"] == 0 and stats["arrivals"] == total
    assert set(stats["buckets"]) == {_digest(secret) for secret in secrets.values()}
    one_bucket = SANDBOX_BURST + RATE
    for bucket in stats["buckets"].values():
        assert bucket["arrivals"] == CALLS_PER_KEY
        assert bucket["worst_window_admitted"] <= one_bucket
    assert stats["worst_window_admitted"] > one_bucket
    # each key's bucket exists in Redis with the API's limits and version
    buckets = key_buckets(redis_client(), api.name, key_prefix=limiter_key_prefix())
    assert buckets.live == len(KEYS) and buckets.complete
    for key in KEYS:
        state = api_limiter(api, key).state()
        assert (state.configured, state.rate, state.config_version) == (
            True,
            RATE,
            api.limits_version,
        )
    # no secret in any row, worker log line or task message (the log has the task arguments)
    with connection.cursor() as cursor:
        for model in (Api, ApiCredential, Job, Call, ThrottleEvent):
            cursor.execute(f"SELECT * FROM {model._meta.db_table}")  # noqa: S608 (our names)
            dump = repr(cursor.fetchall())
            assert "canary-" not in dump, model.__name__
    log = worker.log.read_text()
    assert "ratejobs.execute_calls" in log and "canary-" not in log
    # a limits change reaches every key's bucket at its next grant; a reset resets them all
    api = api_update(api=api, rate=RATE / 2)
    assert api_limiter(api, KEYS[1]).acquire(max_wait=1).slot_us > 0
    assert api_limiter(api, KEYS[1]).state().rate == RATE / 2
    assert api_limiter_reset(api=api) == len(KEYS)
