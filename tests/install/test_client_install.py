"""The limiter alone, as `pip install "ratejobs[requests]"` gives it: no Django, no Celery, and
an example program run from that virtualenv shares a bucket that another process configured,
against a real server enforcing the limit."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest
import redis

from ratejobs.limiter import Limiter, LimiterConfig
from ratejobs.limiter.deployment import limiter_key_prefix
from tests.install.conftest import ROOT, installed_names
from tests.sandbox.conftest import worst_window_excess

RATE, CALLS = 20, 30
# Arrivals come a few milliseconds after their grants, not always the same few: the server
# allows this much more burst (as tests/jobs/test_program_beside_workers.py does).
JITTER_UNITS = 2


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_requests_extra_installs_the_limiter_without_django_and_runs_an_example(
    installed_venv, sandbox, redis_url, tmp_path
):
    # given a virtualenv with ratejobs and its requests extra, and nothing else of the project
    bin_dir = installed_venv("requests")
    names = installed_names(bin_dir)
    assert {"ratejobs", "redis", "requests"} <= names
    assert not names & {"django", "celery", "djangorestframework", "httpx", "aiohttp"}
    # and a bucket of 20/s that a deployment configured under its namespace
    namespace = f"client-{uuid.uuid4().hex[:8]}"
    server = sandbox(rate=RATE, burst=1 + JITTER_UNITS, headers="none")
    deployment = Limiter(
        redis.Redis.from_url(redis_url), "edge", key_prefix=limiter_key_prefix(namespace)
    )
    deployment.configure(LimiterConfig(rate=RATE, period=1, burst=1))
    # when the thread-pool example runs from elsewhere with the deployment's environment
    program = shutil.copy(ROOT / "examples" / "threads_requests.py", tmp_path / "program.py")
    environment = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "REDIS_URL": redis_url,
        "RATEJOBS_LIMITER_NAMESPACE": namespace,
    }
    ran = subprocess.run(
        [str(bin_dir / "python"), str(program), "edge", server.url, str(CALLS)],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # expect: it imported the installed package (not this checkout) and kept the limit
    assert ran.returncode == 0, ran.stderr
    log = server.stats(detail=True)["log"]
    assert len(log) == CALLS
    times = sorted(e["t"] for e in log)
    assert ran.stdout.strip() == f"{{200: {CALLS}}}"
    assert worst_window_excess(times, rate=RATE, period=1, burst=1) <= JITTER_UNITS
