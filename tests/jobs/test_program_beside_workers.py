"""Programs of one's own, outside Django, calling the same API as a running job: the README's
snippet and the four examples (examples/). Started with the deployment's environment and no key
prefix in their code, they take their slots from the workers' bucket, so the API sees one pace
and no 429."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create
from tests.realparts import _worker_env, wait_for_job
from tests.sandbox.conftest import worst_window_excess

ROOT = Path(__file__).resolve().parents[2]
# The README's snippet in a thread pool: a slot, the request, the response fed back.
PROGRAM = """
import os, sys
from concurrent.futures import ThreadPoolExecutor

import redis, requests
from ratejobs.limiter import Limiter

name, url, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
limiter = Limiter(redis.Redis.from_url(os.environ["REDIS_URL"]), name)
session = requests.Session()


def call(i):
    with limiter.slot(max_wait=60) as grant:
        response = session.get(f"{url}/program/{i}")
        limiter.observe(grant, response.status_code, response.headers)
    return response.status_code


with ThreadPoolExecutor(8) as pool:
    statuses = list(pool.map(call, range(calls)))
print({status: statuses.count(status) for status in set(statuses)})
"""
PROGRAMS = {
    "readme": ["-c", PROGRAM],
    "threads_requests": ["examples/threads_requests.py"],
    "asyncio_httpx": ["examples/asyncio_httpx.py"],
    "aiohttp_crawler": ["examples/aiohttp_crawler.py"],
    "multiprocessing_pool": ["examples/multiprocessing_pool.py"],
}
RATE = 20
# The job runs 8 s at the limit: the program, started once the job is under way, takes a second
# or two to start on a loaded machine and must still meet it.
JOB_CALLS, PROGRAM_CALLS = 160, 40
# Arrivals come a few milliseconds after their grants, not always the same few (as in
# test_limits_end_to_end): the sandbox gets this much more burst, a window this much slack.
JITTER_UNITS = 2


@pytest.mark.paced
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("program", PROGRAMS)
def test_a_program_with_the_deployments_environment_shares_the_workers_bucket(
    sandbox, shared_worker, redis_url, unique_name, program
):
    # given a job of 160 calls running on an API that allows 20/s, enforced by the server
    server = sandbox(rate=RATE, burst=1 + JITTER_UNITS, headers="none")
    api = api_create(name=unique_name, base_url=server.url, rate=RATE, burst=1)
    owner = get_user_model().objects.create_user("program-owner", password="x")
    job = job_create(
        owner=owner, api=api, name="beside a program",
        calls=[{"path": f"/items/{i}"} for i in range(JOB_CALLS)],
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while server.stats()["arrivals"] < 5:  # the workers have configured the bucket
        assert time.monotonic() < deadline, "the job sent nothing"
        time.sleep(0.05)
    # when a program started with the deployment's environment sends 40 more to the same API
    environment = {**_worker_env(redis_url), "PYTHONPATH": str(ROOT)}
    ran = subprocess.run(
        [sys.executable, *PROGRAMS[program], api.name, server.url, str(PROGRAM_CALLS)],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    job = wait_for_job(job, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"{{200: {PROGRAM_CALLS}}}"
    # expect: every request of both arrived, none was refused, and no stretch of the arrivals
    # holds more than the API's limit: one bucket paced the workers and the program together
    log = server.stats(detail=True)["log"]
    assert job.succeeded == JOB_CALLS
    assert len(log) == JOB_CALLS + PROGRAM_CALLS
    assert [entry for entry in log if entry["status"] != 200] == []
    times = sorted(entry["t"] for entry in log)
    assert worst_window_excess(times, rate=RATE, period=1, burst=1) <= JITTER_UNITS
    # and they ran at the same time: the program's requests fall among the workers'
    ours = [e["t"] for e in log if e["path"].startswith("/items/")]
    theirs = [e["t"] for e in log if not e["path"].startswith("/items/")]
    assert sum(min(ours) < t < max(ours) for t in theirs) >= PROGRAM_CALLS // 2
    # and together they kept the API's pace: at least 0.9 of its limit from first to last
    span = times[-1] - times[0]
    pace = (len(times) - 1) / span / RATE
    print(f"{program}: {len(times)} arrivals in {span:.2f} s, {pace:.2f} of the limit")
    assert pace >= 0.9
