"""ratejobs against slow APIs, next to bare Celery in the same run; prints markdown tables.

    python -m bench.slow [--quick]

1. A slow API: the sandbox answers after 1 s and allows 100 requests/s (burst 10); the API is
   configured at 100/s (burst 5). First the ceiling: a plain load generator (100 threads with
   requests, no Celery) against the same sandbox without a limit. ratejobs runs 3,000 calls on
   `celery -A project worker -c 2`; bare Celery (bench/bare_tasks.py: one GET, one row UPDATE
   per task) runs on prefork `-c 2` (a sample of 40 calls: at 2 calls/s 3,000 would take 25
   minutes) and on `--pool threads -c 100`.
2. An in-flight cap: the sandbox answers after 2 s with no limit; the API allows 10 calls in
   flight. ratejobs runs 200 calls on `-c 2`; the ceiling is 10 / 2 s = 5 calls/s.

Each row: calls/s from the first call submitted to the last result written, the most worker
memory seen (RSS of all the worker's processes, summed), the most database connections the
worker held at once (PostgreSQL only), the 429s the sandbox sent, and for the cap the most
requests the sandbox had in flight at once. Same database, Redis and clean-up as bench.jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.jobs import Setup, Worker, bare_rows, bench_setup, wait_for_progress

SLOW_LATENCY = 1.0
SLOW_RATE = 100.0
SLOW_BURST = 10
# The API is configured a little tighter than the sandbox, as a careful user does: with the
# same burst on both sides, network jitter alone makes a few requests look early to the server.
API_BURST = 5
# The test bed's ceiling: this many threads of a plain load generator in the bench's process.
GENERATOR_THREADS = 100
SLOW_CALLS = 3_000
BARE_PREFORK_CALLS = 40
CAP = 10
CAP_LATENCY = 2.0
CAP_CALLS = 200
QUICK_DIVISOR = 5
SAMPLE_SECONDS = 0.2
# Worker connections are told apart from the bench's own by this application_name (libpq
# reads PGAPPNAME).
WORKER_APP_NAME = "ratejobs-bench-worker"


@dataclass(frozen=True)
class Row:
    system: str
    pool: str
    calls: int
    done: int
    wall: float
    peak_rss: int
    peak_connections: int | None
    throttled: int
    peak_in_flight: int
    notes: str

    @property
    def per_second(self) -> float:
        return self.done / self.wall if self.wall else 0.0


class Sampler:
    """The most worker memory and database connections seen, every SAMPLE_SECONDS."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.peak_rss = 0
        self.peak_connections: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def _run(self) -> None:
        from django.db import connection

        try:
            while True:
                self.peak_rss = max(self.peak_rss, self.worker.rss_bytes())
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                            [WORKER_APP_NAME],
                        )
                        seen = cursor.fetchone()[0]
                    self.peak_connections = max(self.peak_connections or 0, seen)
                if self._stop.wait(SAMPLE_SECONDS):
                    return
        finally:
            connection.close()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def run_ratejobs(
    setup: Setup, worker: Worker, sandbox: Any, *, calls: int, label: str, **api_options: Any
) -> Row:
    from ratejobs.models import Job
    from ratejobs.services.apis import api_create
    from ratejobs.services.jobs import job_create

    api = api_create(name=f"bench-slow-{uuid.uuid4().hex[:8]}", base_url=sandbox.url, **api_options)
    sandbox.reset()
    _progress(f"ratejobs: {label}, {calls:,} calls")
    with Sampler(worker) as sampler:
        started = time.time()
        job = job_create(
            owner=setup.owner,
            api=api,
            name=label,
            calls=[{"method": "GET", "path": f"/slow/{i}"} for i in range(calls)],
        )

        def progress() -> tuple[int, bool]:
            job.refresh_from_db()
            return job.done, job.status in (Job.Status.COMPLETED, Job.Status.CANCELLED)

        wait_for_progress(label, calls, progress)
    wall = job.finished.timestamp() - started
    return _row("ratejobs", "prefork -c 2", calls, job.succeeded, wall, sandbox, sampler)


def run_bare(setup: Setup, worker: Worker, sandbox: Any, *, calls: int, pool: str) -> Row:
    from django.db.models import Max

    from bench.bare_tasks import bare_call

    ids, written = bare_rows(setup.owner, sandbox.url, calls)
    sandbox.reset()
    _progress(f"bare Celery {pool}: {calls:,} tasks")
    with Sampler(worker) as sampler:
        started = time.time()
        for call_id in ids:
            bare_call.delay(call_id, f"{sandbox.url}/bare/{call_id}")

        def progress() -> tuple[int, bool]:
            count = written.count()
            return count, count == calls

        stalled = wait_for_progress(f"bare {pool}", calls, progress, give_up=True)
    done = written.count()
    last = written.aggregate(last=Max("finished"))["last"]
    wall = (last.timestamp() - started) if last else 0.0
    row = _row("bare Celery", pool, calls, done, wall, sandbox, sampler)
    if stalled:
        row = Row(**{**row.__dict__, "notes": row.notes + f"; {calls - done} never written"})
    return row


def run_load_generator(sandbox: Any, *, calls: int) -> Row:
    """The ceiling of this machine and sandbox: GENERATOR_THREADS plain threads with requests,
    no Celery, no database, no limiter."""
    import requests

    sandbox.reset()
    _progress(f"plain load generator: {GENERATOR_THREADS} threads, {calls:,} requests")
    left = iter(range(calls))
    lock = threading.Lock()

    def send_all() -> None:
        with requests.Session() as session:
            while True:
                with lock:
                    i = next(left, None)
                if i is None:
                    return
                session.get(f"{sandbox.url}/load/{i}", timeout=30)

    threads = [threading.Thread(target=send_all) for _ in range(GENERATOR_THREADS)]
    started = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.time() - started
    stats = sandbox.stats()
    return Row(
        "plain load generator (the ceiling)",
        f"{GENERATOR_THREADS} threads, no limit",
        calls,
        calls,
        wall,
        0,
        None,
        stats["throttled"],
        0,
        "the sandbox without a limit, the same latency; no worker",
    )


def _row(
    system: str, pool: str, calls: int, done: int, wall: float, sandbox: Any, sampler: Sampler
) -> Row:
    stats = sandbox.stats(detail=True)
    arrivals = sorted(entry["t"] for entry in stats["log"])
    peak = sandbox.most_in_flight()
    notes = f"{stats['arrivals']:,} arrivals at the sandbox"
    if len(arrivals) >= 10:
        # the pace once running: arrivals between the 10th and the 90th percentile
        low, high = arrivals[len(arrivals) // 10], arrivals[len(arrivals) * 9 // 10]
        steady = (len(arrivals) * 8 // 10) / (high - low) if high > low else 0.0
        notes += f"; {steady:.1f}/s at the sandbox over the middle 80 % of arrivals"
    return Row(
        system,
        pool,
        calls,
        done,
        wall,
        sampler.peak_rss,
        sampler.peak_connections,
        stats["throttled"],
        peak,
        notes,
    )


def render(title: str, rows: Sequence[Row], about: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| system | pool | calls | calls/s | peak worker RSS MB | peak DB connections | "
        "429s | most in flight at the sandbox | notes |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for row in rows:
        connections = "n/a" if row.peak_connections is None else str(row.peak_connections)
        rss = f"{row.peak_rss / 2**20:.0f}" if row.peak_rss else "n/a"
        lines.append(
            f"| {row.system} | {row.pool} | {row.done:,}/{row.calls:,} | {row.per_second:.1f} | "
            f"{rss} | {connections} | {row.throttled} | "
            f"{row.peak_in_flight} | {row.notes} |"
        )
    return "\n".join([*lines, "", about, ""])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slow", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a fifth of the calls")
    parser.add_argument("--only", choices=["slow", "cap"], help="one of the two tables")
    args = parser.parse_args(argv)
    divisor = QUICK_DIVISOR if args.quick else 1
    out = []
    with contextlib.ExitStack() as cleanup:
        setup = cleanup.enter_context(bench_setup())
        setup.env["PGAPPNAME"] = WORKER_APP_NAME
        from sandbox.process import start_sandbox_process

        def worker(concurrency: int, pool: str = "prefork") -> Worker:
            started = Worker(setup.env, concurrency, setup.tmp / f"worker-{pool}.log", pool)
            cleanup.callback(started.stop)
            return started

        if args.only in (None, "slow"):
            unlimited = start_sandbox_process(no_limit=True, latency=SLOW_LATENCY, headers="none")
            rows = [run_load_generator(unlimited, calls=SLOW_CALLS // divisor)]
            unlimited.stop()
            sandbox = start_sandbox_process(
                rate=SLOW_RATE, burst=SLOW_BURST, latency=SLOW_LATENCY, headers="none"
            )
            cleanup.callback(sandbox.stop)
            prefork = worker(2)
            rows.append(
                run_ratejobs(
                    setup, prefork, sandbox, calls=SLOW_CALLS // divisor, label="slow API",
                    rate=SLOW_RATE, burst=API_BURST,
                )
            )  # fmt: skip
            rows.append(
                run_bare(setup, prefork, sandbox, calls=BARE_PREFORK_CALLS, pool="prefork -c 2")
            )
            prefork.stop()
            threads = worker(100, "threads")
            rows.append(
                run_bare(
                    setup, threads, sandbox, calls=SLOW_CALLS // divisor, pool="threads -c 100"
                )
            )
            threads.stop()
            out.append(
                render(
                    f"A slow API: {SLOW_LATENCY:g} s per response, {SLOW_RATE:g} requests/s "
                    f"allowed (ceiling {SLOW_RATE:g} calls/s)",
                    rows,
                    setup.about,
                )
            )
        if args.only in (None, "cap"):
            sandbox = start_sandbox_process(no_limit=True, latency=CAP_LATENCY, headers="none")
            cleanup.callback(sandbox.stop)
            prefork = worker(2)
            row = run_ratejobs(
                setup, prefork, sandbox, calls=CAP_CALLS // divisor, label="in-flight cap",
                rate=SLOW_RATE, burst=API_BURST, max_concurrency=CAP,
            )  # fmt: skip
            prefork.stop()
            out.append(
                render(
                    f"An in-flight cap of {CAP} on an API answering in {CAP_LATENCY:g} s "
                    f"(ceiling {CAP / CAP_LATENCY:g} calls/s)",
                    [row],
                    setup.about,
                )
            )
    print("\n".join(out))
    return 0


def _progress(message: str) -> None:
    print(f"[bench.slow] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
