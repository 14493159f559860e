"""One job of a million calls, end to end, on the sandbox with no limit; prints one markdown
table of what an operator would watch while it runs.

    python -m bench.million [--calls N] [--workers C] [--minutes M]

The job is written as a JSONL file and submitted with `manage.py submit_job` (a process of its
own, timed). One `celery -A project worker -c C` runs it. While it runs, every few seconds:
the broker's queue (messages, and the calls they carry) and the dispatch window in the
database; every minute the workers' resident memory; every 30 s the admin's job list and job
page, fetched over HTTP from a real gunicorn by a logged-in superuser. `--minutes` cancels the
job after M minutes (a shorter run; the table says so). Everything is bench-only and removed at
the end, as for bench.jobs.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.jobs import (
    API_BURST,
    API_RATE,
    PROJECT_ROOT,
    QUEUE,
    BenchError,
    Worker,
    bench_setup,
    wait_for_progress,
)
from devtools.devredis import free_port
from devtools.processes import stop_process_group

DEFAULT_CALLS = 1_000_000
DEFAULT_WORKERS = 2
# How often the broker and the window are sampled, resident memory read, the admin fetched.
SAMPLE_SECONDS = 2.0
MEMORY_SECONDS = 60.0
ADMIN_SECONDS = 30.0
SERVER_START_TIMEOUT = 60.0
SUBMIT_TIMEOUT = 1800.0
ADMIN_PASSWORD = uuid.uuid4().hex
# The admin's page budget the issue sets, and the submission's.
ADMIN_BUDGET_SECONDS = 0.3
SUBMIT_BUDGET_SECONDS = 60.0


@dataclass
class Watch:
    """What the samplers saw."""

    peak_messages: int = 0
    peak_calls_in_broker: int = 0
    peak_window: int = 0
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, bytes)
    admin: dict[str, list[float]] = field(default_factory=dict)  # page -> seconds per fetch
    admin_errors: list[str] = field(default_factory=list)


def write_calls(path: Path, calls: int) -> None:
    with path.open("w") as out:
        for i in range(calls):
            out.write(json.dumps({"method": "GET", "path": f"/items/{i}"}) + "\n")


def start_web(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "project.wsgi", "--bind", f"127.0.0.1:{port}",
         "--workers", "2"],
        cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log.open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(requests.ConnectionError):
            if requests.get(f"{url}/admin/login/", timeout=5).status_code == 200:
                return process, url
        time.sleep(0.3)
    stop_process_group(process, 10)
    raise BenchError(f"gunicorn did not start:\n{log.read_text(errors='replace')[-2000:]}")


def admin_session(url: str, username: str) -> requests.Session:
    session = requests.Session()
    login = session.get(f"{url}/admin/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)
    if token is None:
        raise BenchError("no CSRF token on the admin's login page")
    answer = session.post(
        f"{url}/admin/login/?next=/admin/",
        data={
            "csrfmiddlewaretoken": token.group(1),
            "username": username,
            "password": ADMIN_PASSWORD,
            "next": "/admin/",
        },
        timeout=10,
    )
    if "sessionid" not in session.cookies or answer.status_code != 200:
        raise BenchError(f"could not log in to the admin (status {answer.status_code})")
    return session


def watch(
    stop: threading.Event, watched: Watch, *, job_id: int, worker: Worker, client: Any,
    session: requests.Session, url: str,
) -> None:  # fmt: skip
    from django.db import connection

    from ratejobs.models import Call
    from ratejobs.namespace import broker_key

    pages = {
        "job list": f"{url}/admin/ratejobs/job/",
        "job page": f"{url}/admin/ratejobs/job/{job_id}/change/",
    }
    started = time.monotonic()
    next_memory = next_admin = started
    in_window = Call.objects.filter(
        job_id=job_id, status=Call.Status.PENDING, dispatched_at__isnull=False
    )
    while not stop.wait(SAMPLE_SECONDS):
        now = time.monotonic()
        messages = client.lrange(broker_key(QUEUE), 0, -1)
        watched.peak_messages = max(watched.peak_messages, len(messages))
        watched.peak_calls_in_broker = max(
            watched.peak_calls_in_broker, sum(_calls_in(m) for m in messages)
        )
        watched.peak_window = max(watched.peak_window, in_window.count())
        if now >= next_memory:
            watched.rss.append((now - started, worker.rss_bytes()))
            next_memory = now + MEMORY_SECONDS
        if now >= next_admin:
            for page, page_url in pages.items():
                began = time.perf_counter()
                try:
                    answer = session.get(page_url, timeout=30)
                    seconds = time.perf_counter() - began
                    if answer.status_code != 200:
                        watched.admin_errors.append(f"{page}: {answer.status_code}")
                    watched.admin.setdefault(page, []).append(seconds)
                except requests.RequestException as exc:
                    watched.admin_errors.append(f"{page}: {type(exc).__name__}")
            next_admin = now + ADMIN_SECONDS
        connection.close()  # this thread's connection: one query every few seconds


def _calls_in(message: bytes) -> int:
    """Calls a message in the broker's queue carries: the length of its second argument."""
    try:
        body = json.loads(message)
        headers = body.get("headers", {})
        if headers.get("task") != "ratejobs.execute_calls":
            return 0
        args = json.loads(base64.b64decode(body["body"]))[0]
        return len(args[1])
    except (ValueError, KeyError, IndexError, TypeError):
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.million", description=__doc__)
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS)
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--minutes", type=float, default=None, help="cancel the job after M min")
    args = parser.parse_args(argv)
    os.environ["RATEJOBS_MAX_CALLS_PER_REQUEST"] = str(max(args.calls, 100_000))
    with contextlib.ExitStack() as cleanup:
        setup = cleanup.enter_context(bench_setup())
        from django.contrib.auth import get_user_model

        from ratejobs.models import Job
        from ratejobs.services.apis import api_create
        from ratejobs.services.jobs import job_cancel
        from sandbox.process import start_sandbox_process

        sandbox = start_sandbox_process(no_limit=True, headers="none")
        cleanup.callback(sandbox.stop)
        admin = get_user_model().objects.create_superuser(
            f"bench-admin-{uuid.uuid4().hex[:6]}", "bench@example.invalid", ADMIN_PASSWORD
        )
        api = api_create(
            name=f"bench-million-{uuid.uuid4().hex[:8]}",
            base_url=sandbox.url,
            rate=API_RATE,
            period=1.0,
            burst=API_BURST,
            max_concurrency=0,
        )
        calls_file = setup.tmp / "calls.jsonl"
        _progress(f"writing {args.calls:,} calls to a JSONL file")
        write_calls(calls_file, args.calls)
        web, url = start_web(setup.env, setup.tmp / "gunicorn.log")
        cleanup.callback(stop_process_group, web, 20)
        session = admin_session(url, admin.username)
        worker = Worker(setup.env, args.workers, setup.tmp / "worker.log")
        cleanup.callback(worker.stop)
        cpu_start = worker.cpu_seconds()

        _progress(f"submit_job: {args.calls:,} calls")
        began = time.time()
        submitted = subprocess.run(
            [sys.executable, "manage.py", "submit_job", "--api", api.name, "--file",
             str(calls_file), "--owner", admin.username, "--name", "bench-million"],
            cwd=PROJECT_ROOT, env={**setup.env, **os.environ}, capture_output=True, text=True,
            timeout=SUBMIT_TIMEOUT,
        )  # fmt: skip
        submit_seconds = time.time() - began
        if submitted.returncode != 0:
            raise BenchError(f"submit_job failed: {submitted.stderr[-2000:]}")
        _progress(f"submit_job took {submit_seconds:.1f} s: {submitted.stdout.strip()}")
        job = Job.objects.get(name="bench-million", api=api)

        watched = Watch()
        stop = threading.Event()
        sampler = threading.Thread(
            target=watch,
            args=(stop, watched),
            kwargs={"job_id": job.pk, "worker": worker, "client": setup.redis,
                    "session": session, "url": url},
            daemon=True,
        )  # fmt: skip
        sampler.start()
        deadline = None if args.minutes is None else time.monotonic() + args.minutes * 60

        def progress() -> tuple[int, bool]:
            job.refresh_from_db()
            if deadline is not None and time.monotonic() > deadline and job.status in Job.ACTIVE:
                _progress(f"--minutes {args.minutes:g} reached: cancelling the job")
                job_cancel(job=job)
            return job.done, job.status in (Job.Status.COMPLETED, Job.Status.CANCELLED)

        try:
            wait_for_progress("million", args.calls, progress, log=worker.text)
        finally:
            stop.set()
            sampler.join()
        cpu = worker.cpu_seconds() - cpu_start
        job.refresh_from_db()
        stats = sandbox.stats()
        about = setup.about
    print(render(args, job, submit_seconds, watched, cpu, stats, about))
    return 0


def render(
    args: argparse.Namespace, job: Any, submit_seconds: float, watched: Watch, cpu: float,
    stats: dict, about: str,
) -> str:  # fmt: skip
    run_seconds = (job.finished - job.started).total_seconds() if job.finished else float("nan")
    done = job.succeeded + job.failed
    rss = watched.rss
    first, last = (rss[0][1], rss[-1][1]) if rss else (0, 0)
    growth = (last - first) / first if first else float("nan")
    rows = [
        ("calls submitted", f"{job.total:,}", ""),
        (
            "submit_job",
            f"{submit_seconds:.1f} s ({job.total / submit_seconds:,.0f} calls/s)",
            f"budget {SUBMIT_BUDGET_SECONDS:.0f} s",
        ),
        (
            "job",
            f"{job.status}: {job.succeeded:,} succeeded, {job.failed:,} failed, "
            f"{job.cancelled:,} cancelled",
            f"arrivals at the sandbox {stats['arrivals']:,}",
        ),
        (
            "run (first call started to job finished)",
            f"{run_seconds:,.0f} s, {done / run_seconds:,.0f} calls/s",
            f"worker CPU {cpu * 1000 / max(done, 1):.2f} ms per call",
        ),
        (
            "broker at peak",
            f"{watched.peak_messages} messages carrying {watched.peak_calls_in_broker:,} calls",
            f"dispatch window at peak {watched.peak_window:,} calls",
        ),
        (
            "worker memory (RSS, all processes)",
            f"first minute {first / 2**20:,.0f} MB, last {last / 2**20:,.0f} MB ({growth:+.1%})",
            f"{len(rss)} samples, one a minute; budget +10 %",
        ),
    ]
    for page, seconds in watched.admin.items():
        rows.append(
            (
                f"admin {page}",
                f"median {statistics.median(seconds) * 1000:.0f} ms, "
                f"worst {max(seconds) * 1000:.0f} ms",
                f"{len(seconds)} fetches while it ran; budget {ADMIN_BUDGET_SECONDS * 1000:.0f} ms",
            )
        )
    if watched.admin_errors:
        rows.append(("admin errors", "; ".join(watched.admin_errors[:5]), ""))
    lines = ["| measure | value | against |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {against} |" for name, value, against in rows]
    scope = f"cancelled after {args.minutes:g} min" if args.minutes else "run to the end"
    lines += [
        "",
        f"One job of {args.calls:,} GETs ({scope}), `celery -A project worker -c "
        f"{args.workers}`, sandbox with no limit, admin served by gunicorn (2 workers); " + about,
    ]
    return "\n".join(lines)


def _progress(message: str) -> None:
    print(f"[bench.million] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
