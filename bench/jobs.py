"""End-to-end ceiling of ratejobs against a sandbox with no limit, next to a bare Celery
baseline run by the same worker in the same run; prints one markdown table.

    python -m bench.jobs [--calls N] [--workers C] [--rounds R] [--quick]
                         [--only plain|cap|cost|bare]

One `celery -A project worker -c C` (prefork) runs every row: ratejobs jobs of N GET calls each
(job_create, the dispatcher's bounded window, attempt_call through the shared limiter, the
result recorded on the call) on a plain API, on one with an in-flight cap of 16, and on one
with a window of tokens whose every call settles its real cost; then N `.delay()`ed bare tasks
(bench/bare_tasks.py: one GET with requests, one row UPDATE). The ratejobs rows run R rounds,
one row after the other in each, and each prints its median round with its share of the plain
row's calls/s in the same round (the median of the rounds' shares): on a shared 2-core machine
one run's calls/s moved by a fifth between runs minutes apart, a round's rows by much less.
Everything is bench-only and removed at the end: a SQLite file in a temporary directory (or,
when DATABASE_URL is set, a database named after it with `_bench` appended on the same server),
Redis database 15 of the server at REDIS_URL (or a private redis-server when nothing answers
there), the sandbox and the worker. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import environ
import redis

from devtools import devredis
from devtools.processes import child_pids, stop_process_group

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CALLS = 10_000
QUICK_CALLS = 1_000
DEFAULT_WORKERS = 2
DEFAULT_ROUNDS = 3
SETTINGS_MODULE = "project.settings.base"
# The run purges the `celery` queue and deletes its keys: it gets a Redis database of its own
# on the server, so the tests' and the demo's queue and limiters in database 0 are left alone.
BENCH_REDIS_DB = 15
QUEUE = "celery"
# How often the broker's queue length is sampled, and how often progress is polled.
SAMPLE_SECONDS = 0.2
POLL_SECONDS = 0.2
# Progress lines on stderr: often enough to see a run is alive, rare enough to read.
PROGRESS_SECONDS = 5.0
# No call finished for this long: something is broken, not slow.
STALL_SECONDS = 60.0
# A worker imports Django and connects to the broker in a few seconds even on a busy machine.
WORKER_START_TIMEOUT = 60.0
WORKER_STOP_TIMEOUT = 20.0
# The API's limit in ratejobs: far above what a few processes can send, so nobody ever waits
# for a slot and the run measures the machinery alone. The sandbox enforces nothing either.
API_RATE = 1_000_000.0
API_BURST = 1000
# An in-flight cap as APIs with concurrency limits set it (most LLM APIs): with the sandbox
# answering in about a millisecond, 16 places carry thousands of calls a second if a place is
# held only while its request is out.
IN_FLIGHT_CAP = 16
# A window of tokens, as an LLM API's is configured, at the largest rate and burst an API
# takes: 10,000 calls/s of TOKENS_ESTIMATE, above what the run sends, so it never binds. Each
# call is estimated at TOKENS_ESTIMATE and the sandbox reports TOKENS_USED, so every call
# settles the difference, as calls to a real LLM API do.
TOKENS_ESTIMATE = 100
TOKENS_USED = 80
TOKEN_WINDOW = {"rate": 1_000_000, "period": 1, "burst": 1_000_000, "unit": "cost"}
PERCENTILES = (0.50, 0.99)
# Worker log lines worth a look: Celery's "[time: LEVEL/process]" prefix, and SQLite giving up.
LOG_LEVEL = re.compile(r": (WARNING|ERROR|CRITICAL)/")
LOG_LOCKED = "database is locked"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Row:
    system: str
    calls: int
    workers: int
    wall: float
    peak_messages: int
    arrivals: int
    notes: str
    of_plain: float | None = None  # this row's calls/s over the plain row's, same round(s)

    @property
    def per_second(self) -> float:
        return self.calls / self.wall


class Worker:
    """`celery -A project worker` in its own process group, logging to a file."""

    def __init__(
        self, env: dict[str, str], concurrency: int, log: Path, pool: str = "prefork"
    ) -> None:
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "project", "worker", "-c", str(concurrency),
             "-P", pool, "-I", "bench.bare_tasks", "-n", f"bench-{uuid.uuid4().hex[:8]}@%h",
             "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-f", str(log)],
            cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        while " ready." not in self.text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"the worker did not start:\n{self.text()[-3000:]}")
            time.sleep(0.2)

    def text(self, start: int = 0) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def cpu_seconds(self) -> float:
        """CPU time used so far by the worker and its pool processes, alive or reaped."""
        total = 0.0
        for pid in [self.process.pid, *child_pids(self.process.pid)]:
            with contextlib.suppress(OSError):
                # /proc/<pid>/stat after the ")" that ends the command name: utime, stime,
                # cutime and cstime are its fields 12 to 15 (proc(5) numbers them 14 to 17).
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                total += sum(int(f) for f in fields[11:15]) / CLOCK_TICKS
        return total

    def rss_bytes(self) -> int:
        """Resident memory of the worker and its pool processes, summed (pages a fork shares
        are counted in each: an upper bound)."""
        total = 0
        for pid in [self.process.pid, *child_pids(self.process.pid)]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def stop(self) -> None:
        """SIGTERM to the whole process group (the pool's children too): a warm shutdown."""
        stop_process_group(self.process, WORKER_STOP_TIMEOUT)


class PeakSampler:
    """The longest the broker's queue got: LLEN of the `celery` list every SAMPLE_SECONDS."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llen-sampler", daemon=True)

    def _run(self) -> None:
        from ratejobs.namespace import broker_key  # after django.setup()

        queue = broker_key(QUEUE)  # under the deployment's namespace (global_keyprefix)
        while True:
            self.peak = max(self.peak, self.client.llen(queue))
            if self._stop.wait(SAMPLE_SECONDS):
                return

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Variant:
    """One ratejobs row: what its API adds to the plain one, and what its calls carry."""

    label: str
    api_fields: dict[str, Any]
    call_fields: dict[str, Any]


PLAIN = Variant("ratejobs", {}, {})
VARIANTS = {
    "plain": PLAIN,
    "cap": Variant(
        f"ratejobs, in-flight cap {IN_FLIGHT_CAP}", {"max_concurrency": IN_FLIGHT_CAP}, {}
    ),
    "cost": Variant(
        f"ratejobs, token window (cost {TOKENS_ESTIMATE} estimated, {TOKENS_USED} used)",
        {"limits": [TOKEN_WINDOW], "cost_header": "X-Tokens-Used"},
        {"query": {"tokens": TOKENS_USED}, "cost": TOKENS_ESTIMATE},
    ),
}


@dataclass
class Context:
    calls: int
    workers: int
    worker: Worker
    sandbox: Any  # sandbox.process.SandboxProcess, imported once Django is set up
    redis: redis.Redis
    owner: Any


def run_ratejobs(ctx: Context, variant: Variant = PLAIN) -> Row:
    """A job of N GETs through ratejobs, timed from job_create to the job's `finished`."""
    from ratejobs.models import Call, Job
    from ratejobs.selectors.apis import api_limiter_state
    from ratejobs.services.apis import api_create
    from ratejobs.services.jobs import job_create
    from ratejobs.worker.dispatch import dispatch_window

    api = api_create(
        name=f"bench-jobs-{uuid.uuid4().hex[:8]}",
        base_url=ctx.sandbox.url,
        rate=API_RATE,
        period=1.0,
        burst=API_BURST,
        **{"max_concurrency": 0, **variant.api_fields},
    )
    specs = [
        {"method": "GET", "path": f"/bench/{i}", **variant.call_fields} for i in range(ctx.calls)
    ]
    ctx.sandbox.reset()
    log_start, cpu_start = ctx.worker.log_size(), ctx.worker.cpu_seconds()
    scripts_start = limiter_round_trips(ctx.redis)
    _progress(f"{variant.label}: job of {ctx.calls:,} calls, {ctx.workers} worker processes")
    with PeakSampler(ctx.redis) as sampler:
        started = time.time()
        job = job_create(owner=ctx.owner, api=api, name="bench-jobs", calls=specs)
        submitted = time.time() - started

        def progress() -> tuple[int, bool]:
            job.refresh_from_db()
            return job.done, job.status in (Job.Status.COMPLETED, Job.Status.CANCELLED)

        _wait(ctx, "ratejobs", progress)
    cpu = ctx.worker.cpu_seconds() - cpu_start
    round_trips = limiter_round_trips(ctx.redis) - scripts_start
    grants = api_limiter_state(api).counts.grants
    wall = job.finished.timestamp() - started
    calls = Call.objects.filter(job=job)
    durations = sorted(d for d in calls.values_list("duration", flat=True) if d is not None)
    throttled = calls.filter(status_code=429).count()
    stats = ctx.sandbox.stats()
    p50, p99 = _percentiles(durations)
    notes = [
        f"job_create {submitted:.2f} s (inside the wall time)",
        f"call duration p50 {_ms(p50)} / p99 {_ms(p99)}",
        f"worker CPU {_ms(cpu / ctx.calls)} per call",
        f"limiter round trips per grant {round_trips / max(grants, 1):.2f} "
        f"({round_trips:,} scripts and waits for {grants:,} grants)",
        f"429s: {throttled} (job.throttled {job.throttled}, sandbox {stats['throttled']})",
        f"{job.succeeded:,} succeeded, {job.failed} failed, {job.retries} retries",
        f"dispatch window {dispatch_window(api)}",
        _log_note(ctx.worker, log_start),
    ]
    if variant.call_fields.get("cost"):
        used = calls.filter(cost_used=TOKENS_USED).count()
        notes.insert(4, f"{used:,} calls recorded {TOKENS_USED} tokens used")
    arrivals = stats["arrivals"]
    return Row(
        variant.label, ctx.calls, ctx.workers, wall, sampler.peak, arrivals, "; ".join(notes)
    )


def bare_rows(owner: Any, base_url: str, calls: int) -> tuple[list[int], Any]:
    """Rows for `calls` bare tasks to update, under a paused job (the dispatcher only looks at
    running and queued jobs, so ratejobs never sends these): their ids, and a queryset of
    those already written."""
    from ratejobs.models import Api, Call, Job

    api = Api.objects.create(
        name=f"bench-bare-{uuid.uuid4().hex[:8]}", base_url=base_url, rate=API_RATE
    )
    job = Job.objects.create(
        owner=owner, api=api, name="bench-bare", status=Job.Status.PAUSED, total=calls
    )
    Call.objects.bulk_create(
        (Call(job=job, index=i, method="GET", path=f"/bare/{i}") for i in range(calls)),
        batch_size=2000,
    )
    ids = list(job.calls.order_by("index").values_list("pk", flat=True))
    return ids, Call.objects.filter(job=job, status_code__isnull=False)


def run_bare(ctx: Context) -> Row:
    """N `.delay()`ed bare tasks, timed from the first `.delay()` to the last row written."""
    from django.db.models import Max

    from bench.bare_tasks import bare_call

    ids, written = bare_rows(ctx.owner, ctx.sandbox.url, ctx.calls)
    ctx.sandbox.reset()
    log_start, cpu_start = ctx.worker.log_size(), ctx.worker.cpu_seconds()
    _progress(f"bare Celery: {ctx.calls:,} tasks with .delay(), {ctx.workers} worker processes")
    with PeakSampler(ctx.redis) as sampler:
        started = time.time()
        for call_id in ids:
            bare_call.delay(call_id, f"{ctx.sandbox.url}/bare/{call_id}")
        enqueued = time.time() - started

        def progress() -> tuple[int, bool]:
            count = written.count()
            return count, count == ctx.calls

        _wait(ctx, "bare Celery", progress)
    cpu = ctx.worker.cpu_seconds() - cpu_start
    wall = written.aggregate(last=Max("finished"))["last"].timestamp() - started
    durations = sorted(written.values_list("duration", flat=True))
    statuses = written.exclude(status_code=200).count()
    stats = ctx.sandbox.stats()
    p50, p99 = _percentiles(durations)
    notes = [
        f"{ctx.calls:,} × .delay() {enqueued:.2f} s (inside the wall time)",
        f"GET duration p50 {_ms(p50)} / p99 {_ms(p99)}",
        f"worker CPU {_ms(cpu / ctx.calls)} per call",
        f"non-200: {statuses}",
        _log_note(ctx.worker, log_start),
    ]
    arrivals = stats["arrivals"]
    return Row(
        "bare Celery", ctx.calls, ctx.workers, wall, sampler.peak, arrivals, "; ".join(notes)
    )


# The Redis commands the limiter runs (its scripts or functions, and its capacity waits) and
# nothing else of ratejobs does.
LIMITER_COMMANDS = ("fcall", "evalsha", "eval", "evalsha_ro", "blpop")


def limiter_round_trips(client: redis.Redis) -> int:
    """Lua scripts and functions run and capacity waits (BLPOP) on the Redis server so far: the
    limiter's round trips, since neither Celery's broker nor the dispatcher runs scripts or BLPOP
    (the broker waits with BRPOP). The server's own count, so run nothing else against it."""
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in LIMITER_COMMANDS)


def _wait(ctx: Context, label: str, progress: Callable[[], tuple[int, bool]]) -> None:
    wait_for_progress(label, ctx.calls, progress, log=ctx.worker.text)


def wait_for_progress(
    label: str,
    total: int,
    progress: Callable[[], tuple[int, bool]],
    *,
    log: Callable[[], str] | None = None,
    give_up: bool = False,
) -> bool:
    """Poll until `progress` says done. When nothing moved for STALL_SECONDS: True if
    `give_up`, else BenchError with the end of `log` (the worker's)."""
    last, moved = -1, time.monotonic()
    reported = time.monotonic()
    while True:
        done, finished = progress()
        if finished:
            return False
        now = time.monotonic()
        if done != last:
            last, moved = done, now
        elif now - moved > STALL_SECONDS:
            if give_up:
                return True
            raise BenchError(
                f"{label}: stuck at {done:,}/{total:,} for {STALL_SECONDS:g} s"
                + (f"; worker log:\n{log()[-3000:]}" if log else "")
            )
        if now - reported > PROGRESS_SECONDS:
            _progress(f"{label}: {done:,}/{total:,}")
            reported = now
        time.sleep(POLL_SECONDS)


def _log_note(worker: Worker, start: int) -> str:
    """What the worker logged during a run beyond INFO; also printed to stderr."""
    lines = worker.text(start).splitlines()
    flagged = [line for line in lines if LOG_LEVEL.search(line) or LOG_LOCKED in line]
    locked = sum(LOG_LOCKED in line for line in lines)
    for line in flagged[:5]:
        _progress(f"worker log: {line[:300]}")
    if not flagged and not locked:
        return "worker log: no warnings or errors"
    return f"worker log: {len(flagged)} warning/error lines, {locked} 'database is locked'"


def _percentiles(values: Sequence[float]) -> list[float]:
    if not values:
        return [float("nan")] * len(PERCENTILES)
    return [values[min(len(values) - 1, int(p * len(values)))] for p in PERCENTILES]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def median_row(rounds: list[dict[str, Row]], name: str) -> Row:
    """Row `name` of its median round (by calls/s), with the median of its rounds' shares of
    the plain row's calls/s and every round's calls/s in its notes."""
    ranked = sorted((round_[name] for round_ in rounds), key=lambda row: row.per_second)
    row = ranked[(len(ranked) - 1) // 2]
    of_plain = None
    if "plain" in rounds[0]:  # every round runs the same rows
        of_plain = statistics.median(
            round_[name].per_second / round_["plain"].per_second for round_ in rounds
        )
    if len(rounds) > 1:
        each = ", ".join(f"{round_[name].per_second:,.0f}" for round_ in rounds)
        notes = f"median of {len(rounds)} rounds (calls/s {each}); {row.notes}"
        row = replace(row, notes=notes)
    return replace(row, of_plain=of_plain)


def render(rows: Sequence[Row], about: str) -> str:
    lines = [
        "| system | calls | workers (processes) | wall time s | calls/s | of plain | "
        "broker messages at peak | arrivals at sandbox | notes |",
        "|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for row in rows:
        of_plain = "" if row.of_plain is None else f"{row.of_plain:.2f}"
        lines.append(
            f"| {row.system} | {row.calls:,} | {row.workers} | {row.wall:.2f} | "
            f"{row.per_second:,.0f} | {of_plain} | {row.peak_messages:,} | {row.arrivals:,} | "
            f"{row.notes} |"
        )
    return "\n".join([*lines, "", about])


def bench_database(tmp: Path) -> tuple[str, Callable[[], None] | None]:
    """The bench's database URL, and how to drop it when one was created on a server."""
    url = os.environ.get("DATABASE_URL")
    sqlite = f"sqlite:///{tmp / 'bench.sqlite3'}"
    if not url:
        return sqlite, None
    config = environ.Env.db_url_config(url)
    if config["ENGINE"].endswith("sqlite3"):
        _progress("DATABASE_URL is SQLite: using a fresh file in a temporary directory instead")
        return sqlite, None
    if not config["ENGINE"].endswith("postgresql"):
        raise BenchError(f"DATABASE_URL: only SQLite and PostgreSQL are supported, not {url!r}")
    import psycopg
    from psycopg import sql

    name = f"{config['NAME']}_bench"
    _progress(
        f"WARNING: DATABASE_URL is set: creating a bench-only database {name!r} on that server "
        "(dropped at the end)"
    )
    params = {
        "host": config.get("HOST") or None,
        "port": config.get("PORT") or None,
        "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None,
        "dbname": config["NAME"],
    }
    params = {k: v for k, v in params.items() if v is not None}
    with psycopg.connect(**params, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            raise BenchError(
                f"database {name!r} already exists (left by an interrupted run?); drop it first"
            )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop() -> None:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(**params, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        _progress(f"dropped database {name!r}")

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}")), drop


def bench_redis_url(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{BENCH_REDIS_DB}"))


def delete_keys(client: redis.Redis) -> int:
    """The keys this run left in its Redis database: limiter and dispatch state, Celery's (all
    under ratejobs:<namespace>:, the others in case a run of an older version left them)."""
    keys = [
        key
        for pattern in ("ratejobs:*", "unacked*", "_kombu.*", QUEUE)
        for key in client.scan_iter(match=pattern, count=1000)
    ]
    return client.delete(*keys) if keys else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.jobs", description=__doc__)
    parser.add_argument("--calls", type=int, default=None, help=f"default {DEFAULT_CALLS:,}")
    parser.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help="worker processes (-c of one worker)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds of the ratejobs rows, default {DEFAULT_ROUNDS} (1 with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_CALLS:,} calls, 1 round")
    parser.add_argument(
        "--only",
        choices=[*VARIANTS, "bare"],
        action="append",
        help="run only these rows (repeatable); default: every ratejobs row, then bare Celery",
    )
    args = parser.parse_args(argv)
    args.only = args.only or [*VARIANTS, "bare"]
    args.calls = args.calls or (QUICK_CALLS if args.quick else DEFAULT_CALLS)
    if args.rounds is None:
        args.rounds = 1 if args.quick else DEFAULT_ROUNDS
    if args.calls < 1 or args.workers < 1 or args.rounds < 1:
        parser.error("--calls, --workers and --rounds must be positive")
    return args


@dataclass
class Setup:
    env: dict[str, str]  # for worker processes
    tmp: Path
    redis: redis.Redis
    owner: Any
    about: str  # the database, Redis, Python and machine, for the table's footnote


@contextlib.contextmanager
def bench_setup() -> Iterator[Setup]:
    """Everything a bench run needs, removed at the end: a database of its own (migrated), a
    Redis database of its own, Django set up in this process, a user owning the jobs."""
    load = os.getloadavg()[0]
    with contextlib.ExitStack() as cleanup:
        tmp = Path(tempfile.mkdtemp(prefix="ratejobs-bench-"))
        cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        server = devredis.ensure(os.environ.get("REDIS_URL", devredis.DEFAULT_URL))
        cleanup.callback(server.stop)
        if server.started_here:
            _progress(f"no Redis answered; started a private one at {server.url}")
        redis_url = bench_redis_url(server.url)
        database_url, drop_database = bench_database(tmp)
        if drop_database is not None:
            cleanup.callback(drop_database)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            # DEBUG keeps every query in memory and makes Celery warn: measure as deployed.
            "DJANGO_DEBUG": "false",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            # The sandbox listens on loopback, which the outbound policy refuses by default.
            "RATEJOBS_OUTBOUND_ALLOW": os.environ.get(
                "RATEJOBS_OUTBOUND_ALLOW", "127.0.0.1/32,::1/128"
            ),
        }
        os.environ.update(env)
        _progress(f"database {_redact(database_url)}, Redis {redis_url}, temp dir {tmp}")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=PROJECT_ROOT,
            env=env,
            check=True,
        )

        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.db import connection

        from project.celery import app

        client = redis.Redis.from_url(redis_url)
        cleanup.callback(client.close)
        cleanup.callback(lambda: _progress(f"deleted {delete_keys(client)} Redis keys"))
        cleanup.callback(app.control.purge)
        app.control.purge()  # messages of an interrupted run name rows that no longer exist
        owner = get_user_model().objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}")
        about = (
            f"{_describe_database(connection)}; Redis {client.info('server')['redis_version']}; "
            f"Python {platform.python_version()}; {os.cpu_count()} cores, load average "
            f"{load:.2f} at the start."
        )
        yield Setup(env, tmp, client, owner, about)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as cleanup:
        setup = cleanup.enter_context(bench_setup())
        from sandbox.process import start_sandbox_process

        sandbox = start_sandbox_process(no_limit=True, headers="none")
        cleanup.callback(sandbox.stop)
        worker = Worker(setup.env, args.workers, setup.tmp / "worker.log")
        cleanup.callback(worker.stop)
        ctx = Context(args.calls, args.workers, worker, sandbox, setup.redis, setup.owner)
        names = [name for name in VARIANTS if name in args.only]
        rounds = [
            {name: run_ratejobs(ctx, VARIANTS[name]) for name in names} for _ in range(args.rounds)
        ]
        rows = [median_row(rounds, name) for name in names]
        if "bare" in args.only:
            bare = run_bare(ctx)
            if "plain" in names:
                plain = statistics.median(row["plain"].per_second for row in rounds)
                bare = replace(bare, of_plain=bare.per_second / plain)
            rows.append(bare)
        about = (
            f"One `celery -A project worker -c {args.workers} -P prefork` ran both, one after the "
            'other; sandbox `no_limit=True, headers="none"` in its own process; ' + setup.about
        )
    print(render(rows, about))
    return 0


def _describe_database(connection: Any) -> str:
    if connection.vendor == "sqlite":
        return f"SQLite {connection.Database.sqlite_version} (WAL)"
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return f"PostgreSQL {cursor.fetchone()[0]}"


def _redact(url: str) -> str:
    password = urlsplit(url).password
    return url.replace(f":{password}@", ":***@") if password else url


def _progress(message: str) -> None:
    print(f"[bench.jobs] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
