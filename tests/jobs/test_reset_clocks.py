"""A reset given as a moment (an epoch X-RateLimit-Reset, an HTTP-date Retry-After) is read on
the limiter's clock, never the worker's: real workers whose wall clocks are off by 30 s
(devtools/wallclock.c preloaded), against a sandbox that sends such resets and no Date header
to read them by."""

from __future__ import annotations

import shutil

import pytest

from devtools import wallclock
from ratejobs.models import ThrottleEvent
from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create
from tests.realparts import wait_for_job

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        shutil.which("cc") is None and shutil.which("gcc") is None,
        reason="needs a C compiler to build devtools/wallclock.c",
    ),
]

# The sandbox enforces 2 requests a second with a burst of 2 and sends its resets in whole
# seconds rounded up: a block it asks for is at most 2 s. A block longer than this was measured
# on a clock other than the sandbox's (a worker 30 s slow blocks 30 s too long).
LONGEST_BLOCK_ASKED_SECONDS = 3.0
CALLS = 8


@pytest.fixture(scope="session")
def wallclock_library(tmp_path_factory):
    return wallclock.build(tmp_path_factory.mktemp("wallclock"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("offset", [30.0, -30.0])
def test_a_worker_whose_clock_is_off_sends_nothing_inside_a_quota_block(
    user, sandbox, start_worker, unique_name, offset, wallclock_library
):
    # given an API that allows 2 requests a second, with no Date on its responses, that we
    # believe allows 20: it answers the third request of a second with a 429 and a Retry-After
    # HTTP-date; then, sending X-RateLimit-Reset epochs too, it says when the quota is spent.
    # One request in flight at a time, so none is on its way when a 429 comes back: any
    # arrival inside a block is one the worker sent knowing of it.
    server = sandbox(rate=2, burst=2, headers="none", retry_after_format="date", date=False)
    api = api_create(name=unique_name, base_url=server.url, rate=20, burst=5, max_concurrency=1)
    # and a worker whose wall clock is 30 s fast or slow, its monotonic clock right, as on a
    # machine whose clock is wrong (libfaketime moves the monotonic clock too, and Python's
    # timed waits, on it, then never end)
    wallclock.check(wallclock_library, offset)
    worker = start_worker(concurrency=1, **wallclock.environment(wallclock_library, offset))
    for headers in ("none", "github"):
        server.configure(headers=headers)
        server.reset()
        job = job_create(
            owner=user,
            api=api,
            name=f"clock {offset} {headers}",
            calls=[{"method": "GET", "path": f"/items/{i}"} for i in range(CALLS)],
        )
        job = wait_for_job(job, timeout=60, worker=worker)
        stats = server.stats()
        blocks = list(ThrottleEvent.objects.filter(job=job).values_list("retry_after", flat=True))
        errors = list(job.calls.exclude(status="succeeded").values_list("status", "error"))
        print(f"{offset} {headers}: sandbox {stats['by_status']}, blocks {blocks}, {errors}")
        # expect: every call done, the API's quota block obeyed by every request (none arrived
        # after a 429 and before its Retry-After), and each block as long as the API asked,
        # not 30 s shorter or longer
        assert job.succeeded == CALLS, errors
        assert stats["retry_after_violations"] == 0
        assert blocks, "the API never said its quota was spent"
        assert all(block <= LONGEST_BLOCK_ASKED_SECONDS for block in blocks if block is not None)
