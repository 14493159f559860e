"""Real parts for end-to-end tests (jobs, admin in a browser): Celery worker processes on the
test database and the real broker, and sandbox API servers in their own processes. The root
conftest makes these fixtures available to every test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from django.db import connection

from devtools.processes import child_pids, stop_process_group
from sandbox.process import SandboxProcess, start_sandbox_process

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# A worker imports Django and connects to the broker in a few seconds even on a busy machine.
WORKER_START_TIMEOUT = 60.0
WORKER_STOP_TIMEOUT = 20.0


def database_url() -> str:
    """The URL of the test database, as the worker processes must open it."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Worker:
    def __init__(self, process: subprocess.Popen, log: Path, name: str) -> None:
        self.process, self.log, self.name = process, log, name

    def pool_pids(self) -> list[int]:
        """The prefork pool's child processes (the ones that run tasks)."""
        return child_pids(self.process.pid)

    def stop(self) -> None:
        stop_process_group(self.process, WORKER_STOP_TIMEOUT)


@pytest.fixture
def start_worker(redis_url, tmp_path) -> Iterator[Callable[..., Worker]]:
    """Start `celery -A project worker` (the plain command) on the test DB and broker."""
    from project.celery import app

    app.conf.broker_url = redis_url
    app.control.purge()  # messages left by an earlier test name rows that no longer exist
    workers: list[Worker] = []

    def start(concurrency: int = 2, *, wrapper: Sequence[str] = (), **env_overrides: str) -> Worker:
        log = tmp_path / f"worker-{len(workers)}.log"
        worker = launch_worker(redis_url, log, concurrency, wrapper=wrapper, **env_overrides)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()
    app.control.purge()


def launch_worker(
    redis_url: str,
    log: Path,
    concurrency: int = 2,
    *,
    wrapper: Sequence[str] = (),
    **env_overrides: str,
) -> Worker:
    """`celery -A project worker` on the test DB and broker, once it is ready; for a fixture of
    a wider scope than start_worker's (the caller stops it). `wrapper` is a command the worker
    runs under (`faketime -f +30s`: a machine whose clock is off)."""
    name = f"test-{uuid.uuid4().hex[:8]}@%h"
    process = _start_celery(
        ["worker", "-c", str(concurrency), "-P", "prefork", "-n", name, "--without-gossip",
         "--without-mingle", "--without-heartbeat"],
        log, {**_worker_env(redis_url), **env_overrides}, wrapper,
    )  # fmt: skip
    worker = Worker(process, log, name)
    try:
        _wait_for_log(worker, " ready.")
    except BaseException:
        worker.stop()
        raise
    return worker


# The module's worker heartbeats this often (test settings: every 2 s), so that each test waits
# at most about this long for its heartbeats after the flush of the one before (shared_worker).
SHARED_WORKER_HEARTBEAT_SECONDS = 0.5


@pytest.fixture(scope="module")
def module_worker(django_db_setup, redis_url, tmp_path_factory) -> Iterator[Worker]:
    """One plain worker for the tests of a module: starting and stopping one takes seconds
    (over ten on a loaded machine), the job of each test a few. Use it through shared_worker."""
    from project.celery import app

    app.conf.broker_url = redis_url
    app.control.purge()
    worker = launch_worker(
        redis_url,
        tmp_path_factory.mktemp("module-worker") / "worker.log",
        RATEJOBS_WORKER_HEARTBEAT_SECONDS=str(SHARED_WORKER_HEARTBEAT_SECONDS),
    )
    yield worker
    worker.stop()
    app.control.purge()


@pytest.fixture
def shared_worker(module_worker: Worker, transactional_db: None) -> Worker:
    """The module's worker, once every pool process's heartbeat is in the database again: the
    flush after each test removes them, and a call claimed without one looks like a dead
    process's, which a sweep takes back and sends a second time."""
    from project.celery import app
    from ratejobs.models import WorkerProcess

    app.control.purge()  # messages of the test before, naming rows that are gone
    pids = set(module_worker.pool_pids())
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while set(WorkerProcess.objects.filter(pid__in=pids).values_list("pid", flat=True)) != pids:
        assert module_worker.process.poll() is None, f"{module_worker.name} died"
        assert time.monotonic() < deadline, f"no heartbeat from {module_worker.name}'s pool"
        time.sleep(0.05)
    return module_worker


@pytest.fixture
def start_beat(redis_url, tmp_path) -> Iterator[Callable[..., Worker]]:
    """Start `celery -A project beat`, which runs the reconciler on its schedule."""
    beats: list[Worker] = []

    def start(**env_overrides: str) -> Worker:
        log = tmp_path / "beat.log"
        process = _start_celery(
            ["beat", "-s", str(tmp_path / "beat-schedule"), "--pidfile="],
            log, {**_worker_env(redis_url), **env_overrides},
        )  # fmt: skip
        beat = Worker(process, log, "beat")
        beats.append(beat)
        _wait_for_log(beat, "beat: Starting")
        return beat

    yield start
    for beat in beats:
        beat.stop()


def _start_celery(
    args: list[str], log: Path, env: dict[str, str], wrapper: Sequence[str] = ()
) -> subprocess.Popen:
    """`celery -A project <args>` in its own process group, logging at INFO to `log`."""
    return subprocess.Popen(
        [*wrapper, sys.executable, "-m", "celery", "-A", "project", *args, "-l", "INFO", "-f",
         str(log)],
        cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=_console(log),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _worker_env(redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings.test",
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
    }


def _console(log: Path):
    """Where a process's stdout and stderr go: what it prints before its log file opens (an
    import error, say) is the only clue when it dies at start."""
    return log.with_suffix(".console").open("wb")


def _wait_for_log(process: Worker, text: str) -> None:
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while text not in _read(process.log):
        if process.process.poll() is not None or time.monotonic() > deadline:
            console = _read(process.log.with_suffix(".console"))
            raise RuntimeError(
                f"{process.name} did not start:\n{_read(process.log)[-3000:]}\n{console[-3000:]}"
            )
        time.sleep(0.2)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def sandbox() -> Iterator[Callable[..., SandboxProcess]]:
    started: list[SandboxProcess] = []

    def start(**options) -> SandboxProcess:
        server = start_sandbox_process(**options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def wait_for_job(job, *, timeout: float, poll: float = 0.2, worker: Worker | None = None):
    """Poll until the job is completed or cancelled; return it (with timings printed). A
    poll is one primary-key read: often enough that a test waits little past its job's end.
    On a timeout, say where its calls are (and the end of `worker`'s log): a job that hangs
    in CI must be diagnosable from CI's output alone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if job.status in ("completed", "cancelled"):
            return job
        time.sleep(poll)
    raise AssertionError(
        f"job {job.pk} still {job.status} after {timeout}s: {job.succeeded} ok, "
        f"{job.failed} failed, {job.total - job.done} left\n{calls_whereabouts(job)}"
        + (f"\nend of {worker.name}'s log:\n{_read(worker.log)[-4000:]}" if worker else "")
    )


def calls_whereabouts(job) -> str:
    """The job's calls counted by status, whether they sit in the broker's window, who claimed
    them and whether they wait for a later attempt; the unfinished ones in detail; and the
    heartbeats the database holds."""
    from collections import Counter

    from ratejobs.models import Call, WorkerProcess

    calls = Call.objects.filter(job=job).order_by("index")
    counts = Counter(
        (c.status, "in window" if c.dispatched_at else "", c.claim_owner, _clock(c.next_attempt_at))
        for c in calls
    )
    details = [
        f"call {c.index} (#{c.pk}): {c.status}, attempts {c.attempts}, dispatched "
        f"{_clock(c.dispatched_at)}, due {_clock(c.next_attempt_at)}, started "
        f"{_clock(c.started)}, owner {c.claim_owner or '-'}, error {c.error[:80]!r}"
        for c in calls.exclude(status__in=Call.FINAL)[:10]
    ]
    beats = WorkerProcess.objects.values_list("owner", "seen_at")
    return "\n".join(
        [
            "calls: " + "; ".join(f"{n} {key}" for key, n in counts.most_common()),
            *details,
            "heartbeats: " + "; ".join(f"{owner} at {_clock(seen)}" for owner, seen in beats),
        ]
    )


def _clock(moment) -> str:
    return "-" if moment is None else f"{moment:%H:%M:%S.%f}"
