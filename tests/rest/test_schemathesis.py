"""The OpenAPI schema tells the truth: schemathesis, with every check it has and the stateful
phase, a fixed seed and a fixed number of cases, against the real server (gunicorn, the test
database and Redis), signed in as a manager, a plain user and a superuser. Its settings, and
why each exception to a check is one, are in schemathesis.toml next to this file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rest_framework.authtoken.models import Token

from ratejobs.limiter import Limiter
from ratejobs.models import Api
from ratejobs.namespace import limiter_key_prefix
from tests.realparts import PROJECT_ROOT

HERE = Path(__file__).resolve().parent
# Fixed: a failure is the same failure on every run, and on every machine.
SEED = "20261124"
# The run takes about half a minute on 2 cores; past this it has hung.
RUN_TIMEOUT_SECONDS = 240
PHASES = ("Examples", "Coverage", "Fuzzing", "Stateful")
# About 2,300 cases with this seed and budget; fewer means the run tested little.
MIN_CASES = 2000
# Server settings for a fuzzer: messages go to an in-memory broker no worker reads, so a job it
# creates never sends a request anywhere; host names are not resolved (resolve_no_names.py);
# job creation is not throttled, or most of the run would test the 429.
SERVER_ENV = {
    "CELERY_BROKER_URL": "memory://",
    "GUNICORN_CMD_ARGS": "--config python:tests.rest.resolve_no_names",
    "RATEJOBS_JOB_CREATE_RATE": "1000000/min",
}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(RUN_TIMEOUT_SECONDS + 60)
def test_the_server_does_what_its_schema_says(
    web_server: Any, manager: Any, user: Any, superuser: Any, redis_client: Any, tmp_path: Path
) -> None:
    # given: three signed-in users and a server that sends no call
    # expect: no failure of any check, in any phase (examples, coverage, fuzzing, stateful)
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"auth": [_identity(u) for u in (manager, user, superuser)]}))
    server = web_server(workers=2, **SERVER_ENV)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "--config-file",
             str(HERE / "schemathesis.toml"), "run", f"{server.url}/api/schema/",
             "--checks", "all", "--phases", ",".join(phase.lower() for phase in PHASES),
             "--seed", SEED, "--workers", "1", "--no-color"],
            cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS,
            env={**os.environ, "RATEJOBS_SCHEMATHESIS_AUTH": str(auth),
                 "SCHEMATHESIS_HOOKS": str(HERE / "schemathesis_hooks.py"),
                 "PYTHONPATH": str(PROJECT_ROOT)},
        )  # fmt: skip
    finally:
        _forget_limiters(redis_client)
    assert run.returncode == 0, run.stdout[-30_000:] + run.stderr[-5_000:]
    # and it ran: every case it generated passed, and none of the 4 phases was skipped
    cases = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert cases and cases[1] == cases[2] and int(cases[1]) > MIN_CASES, run.stdout[-3_000:]
    assert all(f"✅ {phase}" in run.stdout for phase in PHASES), run.stdout[-3_000:]


def _identity(person: Any) -> dict[str, Any]:
    """A user as Web Fuzzing Commons names one: a token, under the user's name."""
    token = Token.objects.create(user=person)
    header = {"name": "Authorization", "value": f"Token {token.key}"}
    return {"name": person.username, "fixedHeaders": [header]}


def _forget_limiters(redis_client: Any) -> None:
    """The limiters of the APIs the run made live in the shared test Redis: removed."""
    for name in Api.objects.values_list("name", flat=True):
        redis_client.delete(*Limiter(redis_client, name, key_prefix=limiter_key_prefix()).keys)
