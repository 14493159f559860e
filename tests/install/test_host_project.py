"""ratejobs inside a Django project of one's own: a new `django-admin startproject` with Celery's
own recipe for a Celery app, ratejobs installed with pip from this checkout and added with the
lines docs/install.md gives (read from the page itself), migrated, then its own web server and
its own `celery -A hostsite worker` run a job against a real server to the end, through the
REST API under the prefix the project chose."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests
from django.db import connection

from devtools import devredis
from devtools.processes import stop_process_group
from tests.install.conftest import ROOT
from tests.sandbox.conftest import worst_window_excess

PAGE = ROOT / "docs" / "install.md"
RATE, CALLS = 20, 40
JITTER_UNITS = (
    2  # arrivals come a few ms after their grants (tests/jobs/test_program_beside_workers.py)
)
START_TIMEOUT = 90.0


def documented_blocks() -> dict[str, str]:
    """The page's code blocks that name a file of the project on their first line
    (`# settings.py`, `# urls.py`, `# celery.py (beside settings.py)`), by that file's name;
    and the SQLite options, by "sqlite"."""
    blocks: dict[str, str] = {}
    for body in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL):
        first = body.splitlines()[0]
        named = re.match(r"# ([a-z_]+\.py)\b", first)
        if named:
            blocks[named.group(1)] = body
        elif body.startswith('DATABASES["default"]["OPTIONS"]'):
            blocks["sqlite"] = body
    return blocks


@pytest.fixture
def host_database() -> Iterator[str]:
    """What the new project's DATABASES["default"] is: a new PostgreSQL database on the suite's
    server when the suite runs on PostgreSQL, else a SQLite file in its directory."""
    settings = connection.settings_dict
    if not settings["ENGINE"].endswith("postgresql"):
        yield "sqlite"
        return
    name = f"host_{uuid.uuid4().hex[:10]}"
    server = {
        "host": settings["HOST"] or "127.0.0.1",
        "port": settings["PORT"] or 5432,
        "user": settings["USER"],
        "password": settings["PASSWORD"] or None,
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**server) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    entry = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "HOST": server["host"],
        "PORT": str(server["port"]),
        "USER": server["user"],
        "PASSWORD": settings["PASSWORD"] or "",
    }
    yield f"DATABASES = {{'default': {entry!r}}}\n"
    with psycopg.connect(**server) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_new_project_with_the_documented_lines_runs_a_job_through_its_own_worker(
    installed_venv, sandbox, redis_url, host_database, tmp_path
):
    # given a new project and a Celery app, ratejobs installed with its app extra
    bin_dir = installed_venv("app", "psycopg[binary]")
    home = tmp_path / "host"
    home.mkdir()
    run = _runner(bin_dir, home, redis_url)
    run("django-admin", "startproject", "hostsite", ".")
    package = home / "hostsite"
    blocks = documented_blocks()
    (package / "celery.py").write_text(blocks["celery.py"])
    (package / "__init__.py").write_text(blocks["__init__.py"])
    # and the documented lines in its settings and URLconf; then what this machine needs: the
    # database, a namespace of its own, and the sandbox on loopback allowed
    namespace = f"host-{uuid.uuid4().hex[:8]}"
    database = blocks["sqlite"] if host_database == "sqlite" else host_database
    with (package / "settings.py").open("a") as settings:
        settings.write("\n" + blocks["settings.py"] + "\n" + database + "\n")
        settings.write(
            f"RATEJOBS_NAMESPACE = {namespace!r}\n"
            "from ratejobs.celery_settings import broker_key_prefix\n"
            "CELERY_BROKER_TRANSPORT_OPTIONS = "
            "{'global_keyprefix': broker_key_prefix(RATEJOBS_NAMESPACE)}\n"
            'RATEJOBS_OUTBOUND_ALLOW = ["127.0.0.1/32"]\n'
        )
    with (package / "urls.py").open("a") as urls:
        urls.write("\n" + blocks["urls.py"])
    assert "ratejobs.E" not in run("python", "manage.py", "check")
    run("python", "manage.py", "migrate", "--no-input")
    run("python", "manage.py", "createsuperuser", "--no-input", "--username", "admin",
        "--email", "admin@example.com")  # fmt: skip
    token = run("python", "manage.py", "drf_create_token", "admin").split()[2]
    # when its own worker and web server run, and a job goes in through the REST API
    server = sandbox(rate=RATE, burst=1 + JITTER_UNITS, headers="none")
    processes = []
    try:
        processes.append(_start(bin_dir, home, redis_url, "celery", "-A", "hostsite", "worker",
                                "-l", "INFO", "-c", "2", log=tmp_path / "worker.log"))  # fmt: skip
        port = devredis.free_port()
        web = ("python", "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}")
        processes.append(_start(bin_dir, home, redis_url, *web, log=tmp_path / "web.log"))
        api = f"http://127.0.0.1:{port}/ratejobs/api"
        session = requests.Session()
        session.trust_env = False
        session.headers["Authorization"] = f"Token {token}"
        _wait_until_answering(session, f"{api}/", tmp_path / "web.log")
        made = session.post(f"{api}/apis/", json={
            "name": "sandbox", "base_url": server.url, "rate": RATE, "period": 1, "burst": 1,
        })  # fmt: skip
        assert made.status_code == 201, made.text
        job = session.post(f"{api}/jobs/", json={
            "api": "sandbox", "name": "from the host",
            "calls": [{"method": "GET", "path": f"/items/{i}"} for i in range(CALLS)],
        })  # fmt: skip
        assert job.status_code == 201, job.text
        finished = _wait_for_job(session, f"{api}/jobs/{job.json()['id']}/", tmp_path)
        # and the overview answers under the prefix, behind the admin's sign-in
        overview = session.get(f"http://127.0.0.1:{port}/ratejobs/overview/")
        assert overview.history and "/admin/login/" in overview.url, overview.url
    finally:
        for process in processes:
            stop_process_group(process, 20)
    # expect: every call ran once, through the project's own worker, at the API's pace
    assert finished["status"] == "completed", finished
    assert finished["succeeded"] == CALLS, finished
    log = server.stats(detail=True)["log"]
    assert len(log) == CALLS
    assert [entry for entry in log if entry["status"] != 200] == []
    times = sorted(entry["t"] for entry in log)
    assert worst_window_excess(times, rate=RATE, period=1, burst=1) <= JITTER_UNITS
    worker_log = (tmp_path / "worker.log").read_text()
    assert "ratejobs.execute_calls" in worker_log


def _environment(bin_dir: Path, home: Path, redis_url: str) -> dict[str, str]:
    """Only what an operator's shell would hold: none of the suite's own settings."""
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "REDIS_URL": redis_url,
        "DJANGO_SUPERUSER_PASSWORD": "a-long-password-for-the-host",
    }


def _runner(bin_dir: Path, home: Path, redis_url: str):
    def run(*command: str) -> str:
        done = subprocess.run(
            list(command), cwd=home, env=_environment(bin_dir, home, redis_url),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    return run


def _start(bin_dir: Path, home: Path, redis_url: str, *command: str, log: Path):
    return subprocess.Popen(
        list(command), cwd=home, env=_environment(bin_dir, home, redis_url),
        stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _wait_until_answering(session: requests.Session, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            if session.get(url, timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)


def _wait_for_job(session: requests.Session, url: str, logs: Path) -> dict:
    deadline = time.monotonic() + 120
    while True:
        job = session.get(url, timeout=10).json()
        if job["status"] in ("completed", "cancelled"):
            return job
        if time.monotonic() > deadline:
            worker = (logs / "worker.log").read_text()[-4000:]
            raise AssertionError(f"job not finished: {job}\n{worker}")
        time.sleep(0.5)
