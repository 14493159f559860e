"""A job's results out: `manage.py export_results` and the REST download of a million-call job,
in calls/s and peak resident memory; prints one markdown table.

    python -m bench.export [--calls N] [--small-calls M] [--body-bytes S]
    python -m bench.export --slow-downloads [--calls N]

PostgreSQL only (as deployed): a `<name>_bench` database is made on the server of DATABASE_URL
and dropped at the end, as for bench.jobs. Two finished jobs are loaded with INSERT ... SELECT
over generate_series (bench.retention's loader), N calls and M calls, with small JSON bodies (S
more bytes each with --body-bytes), one call in 100 a binary body (base64 in the file) and one
in 50 failed. Each job is then exported in both formats by
`manage.py export_results` with stdout on /dev/null (peak RSS from the process's own rusage,
wait4), and downloaded over HTTP from a real gunicorn (2 sync workers, --timeout 600: one
download at a time, as in the earlier figures) by a client reading 1 MiB at a time (peak RSS:
the workers' VmRSS sampled every 100 ms).
Constant memory reads as the same peak for M calls and for N.

--slow-downloads asks what clients reading slowly do to everyone else: one job of N calls
(100,000 unless given), served by gunicorn (2 workers, --timeout 600) with sync workers and
with gthread workers of GTHREAD_THREADS threads. SLOW_CLIENTS clients each download its JSON
lines at SLOW_BYTES_PER_SECOND through a small receive buffer; meanwhile PROBES requests of a
job's detail (`GET /api/jobs/{id}/`), one after another, each given PROBE_TIMEOUT seconds, and
the web server's PostgreSQL sessions (its PGAPPNAME) in pg_stat_activity; the same probes
before the downloads begin are the baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import requests
from urllib3.connection import HTTPConnection

from bench.jobs import PROJECT_ROOT, BenchError, bench_setup
from bench.million import start_web
from bench.retention import insert_generated
from devtools.processes import child_pids, stop_process_group

DEFAULT_CALLS = 1_000_000
DEFAULT_SMALL_CALLS = 100_000
FORMATS = ("jsonl", "csv")
# The floor for a million-call export.
TARGET_CALLS_PER_SECOND = 20_000
SAMPLE_SECONDS = 0.1
READ_BYTES = 1024 * 1024
EXPORT_TIMEOUT = 1800.0
# --slow-downloads: three clients on slow links, each far slower than the server writes (a
# 32 MiB file at 256 KiB/s takes two minutes: they are still reading when the probes end).
DEFAULT_SLOW_CALLS = 100_000
SLOW_CLIENTS = 3
SLOW_READ_BYTES = 64 * 1024
SLOW_BYTES_PER_SECOND = 256 * 1024
# A slow link's receive buffer; loopback's, autotuned up to tens of MiB, would take most of the
# file at once and free the server early.
SLOW_RECEIVE_BUFFER = 64 * 1024
# How long the downloads have to begin before the probes start: long enough for a free worker
# to answer on a loaded machine, so a download still waiting then waits for a worker.
SLOW_START_SECONDS = 10.0
PROBES = 10
PROBE_TIMEOUT = 5.0
GTHREAD_THREADS = 4
WEB_APP_NAME = "bench-export-web"


@dataclass(frozen=True)
class Run:
    way: str
    format: str
    calls: int
    seconds: float
    peak_rss: int  # bytes
    output: int | None  # bytes, when counted

    @property
    def rate(self) -> float:
        return self.calls / self.seconds


def load(owner: Any, calls: int, name: str, body_bytes: int = 0) -> Any:
    """A completed job of `calls` calls: JSON bodies of about 60 bytes (plus `body_bytes` of
    padding), a binary one in 100, a failed call (503, five attempts) in 50."""
    from django.utils import timezone

    from ratejobs.models import Call, Job
    from ratejobs.services.apis import api_create

    api = api_create(
        name=f"bench-export-{random.randrange(16**8):08x}",
        base_url="https://api.example.com",
        rate=100.0,
    )
    finished = timezone.now() - timedelta(hours=1)
    failed = calls // 50
    job = Job.objects.create(
        owner=owner,
        api=api,
        name=name,
        status=Job.Status.COMPLETED,
        total=calls,
        succeeded=calls - failed,
        failed=failed,
        started=finished,
        finished=finished,
    )
    pad = f', "pad": "{"x" * body_bytes}"' if body_bytes else ""
    # mod(), not %: the statement has parameters
    fails = "mod(i, 50) = 0"
    insert_generated(
        Call,
        calls,
        {
            "job": ("%s", job.pk),
            "index": "i",
            "method": "'GET'",
            "path": "'/items/' || i",
            "status": f"CASE WHEN {fails} THEN 'failed' ELSE 'succeeded' END",
            "attempts": f"CASE WHEN {fails} THEN 5 ELSE 1 END",
            "status_code": f"CASE WHEN {fails} THEN 503 ELSE 200 END",
            "error": f"CASE WHEN {fails} THEN 'HTTP 503 after 5 attempts' ELSE '' END",
            "duration": "0.05 + mod(i, 100) / 1000.0",
            "response_body": (
                "CASE WHEN mod(i, 100) = 1 THEN decode('fffe0001' || lpad(to_hex(i), 8, '0'), "
                "'hex') ELSE convert_to(format(%s, i, i), 'UTF8') END",
                '{"id": %s, "name": "item %s", "ok": true' + pad + "}",
            ),
            "started": ("%s", finished),
            "finished": ("%s", finished),
        },
    )
    return job


def command_run(env: dict[str, str], job: Any, format: str, log: Path) -> Run:
    """export_results in a process of its own, stdout on /dev/null; its peak RSS from wait4."""
    command = [sys.executable, "manage.py", "export_results", str(job.pk), "--format", format]
    with open(os.devnull, "wb") as sink, log.open("ab") as errors:
        began = time.perf_counter()
        process = subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=sink, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - began
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise BenchError(f"export_results failed:\n{log.read_text(errors='replace')[-2000:]}")
    # ru_maxrss is in KiB on Linux
    return Run("`export_results` > /dev/null", format, job.total, seconds, usage.ru_maxrss * 1024,
               None)  # fmt: skip


def rss(pid: int) -> int:
    """The process's resident memory now, in bytes (0 once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def rest_run(url: str, token: str, workers: list[int], job: Any, format: str) -> Run:
    """The download through gunicorn, read as it comes; the workers' RSS sampled meanwhile."""
    peak = max(rss(pid) for pid in workers)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(SAMPLE_SECONDS):
            peak = max(peak, *(rss(pid) for pid in workers))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    size = lines = 0
    began = time.perf_counter()
    try:
        with requests.get(
            f"{url}/api/jobs/{job.pk}/results.{format}",
            headers={"Authorization": f"Token {token}"},
            stream=True,
            timeout=EXPORT_TIMEOUT,
        ) as response:
            if response.status_code != 200:
                raise BenchError(f"download: {response.status_code} {response.text[:500]}")
            for piece in response.iter_content(READ_BYTES):
                size += len(piece)
                lines += piece.count(b"\n")
        seconds = time.perf_counter() - began
    finally:
        stop.set()
        sampler.join()
    expected = job.total + (format == "csv")  # CSV's header line; no body here holds a newline
    if lines != expected:
        raise BenchError(f"download of job {job.pk} as {format}: {lines} lines, not {expected}")
    return Run("REST through gunicorn", format, job.total, seconds, peak, size)


def render(runs: Sequence[Run], about: str) -> str:
    lines = [
        "| way | format | calls | seconds | calls/s | peak RSS | file |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        output = "—" if run.output is None else f"{run.output / 2**20:,.0f} MiB"
        lines.append(
            f"| {run.way} | {run.format} | {run.calls:,} | {run.seconds:.1f} | {run.rate:,.0f} | "
            f"{run.peak_rss / 2**20:,.0f} MiB | {output} |"
        )
    largest = max(run.calls for run in runs)
    slowest = min(run.rate for run in runs if run.calls == largest)
    verdict = "holds" if slowest >= TARGET_CALLS_PER_SECOND else "BROKEN"
    return "\n".join(
        [
            *lines,
            "",
            f"Slowest export of {largest:,} calls: {slowest:,.0f} calls/s against a floor of "
            f"{TARGET_CALLS_PER_SECOND:,}: {verdict}. Peak RSS: the command's own (wait4); the "
            "gunicorn workers' largest VmRSS, sampled every "
            f"{SAMPLE_SECONDS * 1000:.0f} ms, whole process (Django loaded) included.",
            "",
            about,
        ]
    )


# The web servers --slow-downloads compares: a name, and what GUNICORN_CMD_ARGS adds.
SLOW_SERVERS = (
    ("sync", ""),
    (f"gthread, {GTHREAD_THREADS} threads", f"--worker-class gthread --threads {GTHREAD_THREADS}"),
)


@dataclass(frozen=True)
class SlowRun:
    server: str
    downloading: int  # slow downloads being served when the probes began
    baseline: list[float | None]  # seconds per probe before the downloads; None: no answer
    probes: list[float | None]  # the same while the downloads were read
    in_transaction: int  # most web server sessions seen "idle in transaction" at once


class _SlowLink(requests.adapters.HTTPAdapter):
    """Connections whose receive buffer is SLOW_RECEIVE_BUFFER."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["socket_options"] = [
            *HTTPConnection.default_socket_options,
            (socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RECEIVE_BUFFER),
        ]
        super().init_poolmanager(*args, **kwargs)


class SlowClient:
    """A download read at SLOW_BYTES_PER_SECOND in a thread of its own until stopped."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.began = threading.Event()
        self._session = requests.Session()
        self._session.mount("http://", _SlowLink())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url, headers), daemon=True)
        self._thread.start()

    def _read(self, url: str, headers: dict[str, str]) -> None:
        # its server stopped or its connection reset: the download is over either way
        with (
            contextlib.suppress(requests.RequestException),
            self._session.get(url, headers=headers, stream=True, timeout=EXPORT_TIMEOUT) as got,
        ):
            for piece in got.iter_content(SLOW_READ_BYTES):
                self.began.set()
                if self._stop.wait(len(piece) / SLOW_BYTES_PER_SECOND):
                    return

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> None:
        self._thread.join(PROBE_TIMEOUT)
        self._session.close()


def probe(url: str, headers: dict[str, str]) -> float | None:
    """Seconds for a 200 from `url`; None when no answer came within PROBE_TIMEOUT."""
    began = time.perf_counter()
    try:
        response = requests.get(url, headers=headers, timeout=PROBE_TIMEOUT)
    except requests.Timeout:
        return None
    if response.status_code != 200:
        raise BenchError(f"probe: {response.status_code} {response.text[:500]}")
    return time.perf_counter() - began


def sessions_in_transaction() -> int:
    """The web server's PostgreSQL sessions (PGAPPNAME) now idle in a transaction."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND state = 'idle in transaction'",
            [WEB_APP_NAME],
        )
        return cursor.fetchone()[0]


@contextlib.contextmanager
def slow_clients(url: str, headers: dict[str, str]) -> Iterator[list[SlowClient]]:
    clients = [SlowClient(url, headers) for _ in range(SLOW_CLIENTS)]
    try:
        yield clients
    finally:
        for client in clients:
            client.stop()


def slow_run(
    env: dict[str, str], log: Path, token: str, job: Any, name: str, extra: str
) -> SlowRun:
    """PROBES before and while SLOW_CLIENTS read the job's results slowly, on a web server
    whose GUNICORN_CMD_ARGS add `extra`."""
    # --preload: the app is loaded before the port opens, so start_web's first request (5 s at
    # most) does not wait for the workers to import Django, which takes longer on a busy machine.
    args = f"--timeout 600 --preload {extra}"
    web, url = start_web({**env, "GUNICORN_CMD_ARGS": args, "PGAPPNAME": WEB_APP_NAME}, log)
    headers = {"Authorization": f"Token {token}"}
    detail = f"{url}/api/jobs/{job.pk}/"
    try:
        baseline = [probe(detail, headers) for _ in range(PROBES)]
        with slow_clients(f"{detail}results.jsonl", headers) as clients:
            deadline = time.monotonic() + SLOW_START_SECONDS
            for client in clients:
                client.began.wait(max(0.0, deadline - time.monotonic()))
            downloading = sum(client.began.is_set() for client in clients)
            probes, in_transaction = [], 0
            for _ in range(PROBES):
                probes.append(probe(detail, headers))
                in_transaction = max(in_transaction, sessions_in_transaction())
    finally:
        stop_process_group(web, 10)  # ends the downloads still waiting for a worker
    for client in clients:
        client.join()
    return SlowRun(name, downloading, baseline, probes, in_transaction)


def render_slow(runs: Sequence[SlowRun], about: str) -> str:
    def seconds(values: list[float | None]) -> str:
        answered = [value for value in values if value is not None]
        if not answered:
            return "—"
        return f"{statistics.median(answered) * 1000:,.0f} / {max(answered) * 1000:,.0f} ms"

    lines = [
        f"| web server (2 workers) | slow downloads served (of {SLOW_CLIENTS}) | probes answered "
        f"within {PROBE_TIMEOUT:.0f} s | probe p50 / max | before the downloads: p50 / max | "
        "web sessions idle in transaction |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        answered = sum(value is not None for value in run.probes)
        lines.append(
            f"| {run.server} | {run.downloading} | {answered} of {len(run.probes)} | "
            f"{seconds(run.probes)} | {seconds(run.baseline)} | {run.in_transaction} |"
        )
    return "\n".join(
        [
            *lines,
            "",
            f"{SLOW_CLIENTS} clients each read the job's JSON lines at "
            f"{SLOW_BYTES_PER_SECOND // 1024} KiB/s with a receive buffer of "
            f"{SLOW_RECEIVE_BUFFER // 1024} KiB, started {SLOW_START_SECONDS:.0f} s before "
            f"the probes: {PROBES} `GET /api/jobs/{{id}}/` one after another, each given "
            f"{PROBE_TIMEOUT:.0f} s; the sessions counted from pg_stat_activity at each probe "
            "(the most at once). " + about,
        ]
    )


def main_slow(calls: int) -> int:
    with contextlib.ExitStack() as cleanup:
        setup = cleanup.enter_context(bench_setup())
        from django.db import connection
        from rest_framework.authtoken.models import Token

        if connection.vendor != "postgresql":
            raise BenchError("bench.export --slow-downloads reads pg_stat_activity: PostgreSQL")
        job = load(setup.owner, calls, f"{calls:,} calls")
        token = Token.objects.create(user=setup.owner).key
        runs = []
        for name, extra in SLOW_SERVERS:
            runs.append(slow_run(setup.env, setup.tmp / f"web-{name[:7]}.log", token, job, name,
                                 extra))  # fmt: skip
            _progress(f"{name}: {runs[-1]}")
        about = f"A job of {calls:,} calls (bodies as above); " + setup.about
    print(render_slow(runs, about))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.export", description=__doc__)
    parser.add_argument("--calls", type=int)
    parser.add_argument("--small-calls", type=int, default=DEFAULT_SMALL_CALLS)
    parser.add_argument("--body-bytes", type=int, default=0, help="padding in each JSON body")
    parser.add_argument(
        "--slow-downloads", action="store_true", help="slow clients against other requests"
    )
    args = parser.parse_args(argv)
    if args.calls is None:
        args.calls = DEFAULT_SLOW_CALLS if args.slow_downloads else DEFAULT_CALLS
    if args.calls < 1 or args.small_calls < 1 or args.body_bytes < 0:
        parser.error("--calls and --small-calls must be positive, --body-bytes not negative")
    if args.slow_downloads:
        return main_slow(args.calls)
    with contextlib.ExitStack() as cleanup:
        setup = cleanup.enter_context(bench_setup())
        from django.db import connection
        from rest_framework.authtoken.models import Token

        from ratejobs.models import Call

        if connection.vendor != "postgresql":
            raise BenchError("bench.export measures the export on PostgreSQL: set DATABASE_URL")
        began = time.perf_counter()
        jobs = [
            load(setup.owner, n, f"{n:,} calls", args.body_bytes)
            for n in (args.small_calls, args.calls)
        ]
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM (ANALYZE) {connection.ops.quote_name(Call._meta.db_table)}")
        _progress(f"loaded in {time.perf_counter() - began:.0f} s")
        connection.close()  # the exports run in other processes

        runs = []
        for job in jobs:
            for format in FORMATS:
                runs.append(command_run(setup.env, job, format, setup.tmp / "command.log"))
                _progress(f"{runs[-1].way} {format} {job.total:,}: {runs[-1].seconds:.1f} s")

        token = Token.objects.create(user=setup.owner).key
        env = {**setup.env, "GUNICORN_CMD_ARGS": "--timeout 600"}
        web, url = start_web(env, setup.tmp / "web.log")
        cleanup.callback(stop_process_group, web, 10)
        workers = child_pids(web.pid)
        for job in jobs:
            for format in FORMATS:
                runs.append(rest_run(url, token, workers, job, format))
                _progress(f"{runs[-1].way} {format} {job.total:,}: {runs[-1].seconds:.1f} s")
        about = (
            f"Bodies of about {60 + args.body_bytes:,} bytes (one in 100 binary, base64 in the "
            "file), one call in 50 failed; the client read through `requests` in the bench's "
            "process; " + setup.about
        )
    print(render(runs, about))
    return 0


def _progress(message: str) -> None:
    print(f"[bench.export] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
