"""Retention and purge on a million rows while workers write beside them: how long each batch
holds its locks, and how long a worker's own small writes wait meanwhile; prints one markdown
table.

    python -m bench.retention [--rows N] [--batch-size B] [--body-bytes S]

PostgreSQL only (the question is about its locks): a `<name>_bench` database is made on the
server of DATABASE_URL and dropped at the end, as for bench.jobs. Loaded with INSERT ... SELECT
over generate_series (the fastest way in, and no worker needed): one job finished 40 days ago
with N calls, each with an S-byte JSON body and headers, N throttle events 40 days old (and a
thousand fresh ones that must stay), and a running job of 1,000 calls. Then, in turn:
`throttle_events_remove_old(days=30)`, `call_bodies_remove_old(days=30)` and `job_purge` of the
old job, after 15 s of nothing (the machine's own noise, to read the rest against). All
along, a probe thread does what a worker does on the running job, each statement its own
transaction: UPDATE one of its calls, INSERT a throttle event; it times each. A sampler polls
pg_locks (the longest any backend of the database has waited for a lock, `waitstart`) and
pg_stat_activity (how long the retention's transaction has been open once it wrote: only then
does it hold row locks) every 50 ms, and notes what a probe statement slower than 100 ms
waits on. Autovacuum may be off: the load is followed by VACUUM (ANALYZE), as autovacuum would
leave a table that old, and a CHECKPOINT (a superuser's, or pg_checkpoint's), so that writing
the load out is not measured.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from bench.jobs import BenchError, bench_setup

DEFAULT_ROWS = 1_000_000
DEFAULT_BODY_BYTES = 1024
# Rows per INSERT while loading: a progress line each, and no statement of minutes.
LOAD_CHUNK = 100_000
RUNNING_JOB_CALLS = 1_000
FRESH_EVENTS = 1_000
AGE_DAYS = 40
KEEP_DAYS = 30
# A worker's write waits this long at most while retention runs (the bound).
BUDGET_SECONDS = 1.0
PROBE_PAUSE_SECONDS = 0.01
SAMPLE_SECONDS = 0.05
BASELINE_SECONDS = 15.0
SLOW_SECONDS = 0.1


@dataclass
class Watch:
    """What the probe and the sampler saw: (perf_counter at the end, seconds) per probe write,
    and per sample the longest lock wait and the age of the retention's writing transaction,
    in seconds."""

    probes: list[tuple[float, float]] = field(default_factory=list)
    probe_errors: list[str] = field(default_factory=list)
    lock_waits: list[tuple[float, float]] = field(default_factory=list)
    transactions: list[tuple[float, float]] = field(default_factory=list)
    # what a probe statement running for over SLOW_SECONDS was waiting on, when sampled
    slow_waits: list[tuple[float, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Phase:
    name: str
    rows: int
    batches: int
    longest_batch: float
    began: float
    ended: float
    wal_bytes: int  # written by the whole server meanwhile
    checkpoints: int


def server_counters() -> tuple[int, int]:
    """WAL written so far and checkpoints begun, by the whole server."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, "
            "checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        )
        wal, checkpoints = cursor.fetchone()
    return int(wal), int(checkpoints)


def insert_generated(model: Any, rows: int, given: dict[str, str | tuple[str, Any]]) -> None:
    """INSERT ... SELECT over generate_series AS i: `given` maps a field to an SQL expression
    of i, or to an expression with one %s and its value; every other column gets the model's
    own default, as a submission would leave it."""
    from django.db import connection

    quote = connection.ops.quote_name
    template = model()
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    missing = set(given) - {f.name for f in fields}
    if missing:
        raise BenchError(f"{model.__name__} has no fields {sorted(missing)}")
    columns, values, params = [], [], []
    for f in fields:
        columns.append(quote(f.column))
        expression = given.get(f.name)
        if expression is None:
            values.append("%s")
            params.append(f.get_db_prep_save(f.pre_save(template, add=True), connection))
        elif isinstance(expression, tuple):
            values.append(expression[0])
            params.append(expression[1])
        else:
            values.append(expression)
    for start in range(0, rows, LOAD_CHUNK):
        count = min(LOAD_CHUNK, rows - start)
        # names come from the model and expressions from this file; values go as parameters
        statement = (
            f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(columns)}) "  # noqa: S608
            f"SELECT {', '.join(values)} FROM generate_series({start}, {start + count - 1}) AS i"
        )
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
        _progress(f"{model.__name__}: {start + count:,}/{rows:,} rows")


def load(rows: int, body_bytes: int, owner: Any) -> tuple[Any, Any, list[int]]:
    """The old job (with its calls, events and per-second counts) and the running one; the
    ids of the running job's calls, for the probe."""
    from django.db import connection
    from django.utils import timezone

    from ratejobs.models import Call, Job, JobSecond, ThrottleEvent
    from ratejobs.services.apis import api_create
    from ratejobs.services.jobs import job_create

    api = api_create(
        name=f"bench-retention-{random.randrange(16**8):08x}",
        base_url="https://api.example.com",
        rate=100.0,
    )
    finished = timezone.now() - timedelta(days=AGE_DAYS)
    old = Job.objects.create(
        owner=owner,
        api=api,
        name="old",
        status=Job.Status.COMPLETED,
        total=rows,
        succeeded=rows,
        started=finished,
        finished=finished,
    )
    filler = "x" * max(body_bytes - 40, 0)
    began = time.perf_counter()
    insert_generated(
        Call,
        rows,
        {
            "job": ("%s", old.pk),
            "index": "i",
            "method": "'GET'",
            "path": "'/items/' || i",
            "status": "'succeeded'",
            "attempts": "1",
            "status_code": "200",
            "response_headers": """'{"Content-Type": "application/json"}'::jsonb""",
            "response_body": (
                """convert_to('{"id": ' || i || ', "data": "' || %s || '"}', 'UTF8')""",
                filler,
            ),
            "started": ("%s", finished),
            "finished": ("%s", finished),
        },
    )
    insert_generated(
        ThrottleEvent,
        rows,
        {
            "api": ("%s", api.pk),
            "job": ("%s", old.pk),
            "kind": "'throttled'",
            "status_code": "429",
            "retry_after": "1.0",
            "created": ("%s - i * interval '1 millisecond'", finished),
        },
    )
    seconds = max(rows // 800, 1)  # a million-call job ran at about 800 calls/s (bench.million)
    insert_generated(
        JobSecond,
        seconds,
        {"job": ("%s", old.pk), "at": ("%s + i * interval '1 second'", finished), "calls": "800"},
    )
    load_seconds = time.perf_counter() - began
    running = job_create(
        owner=owner,
        api=api,
        name="running",
        calls=[{"path": f"/live/{i}"} for i in range(RUNNING_JOB_CALLS)],
    )
    Job.objects.filter(pk=running.pk).update(status=Job.Status.RUNNING, started=timezone.now())
    ThrottleEvent.objects.bulk_create(
        ThrottleEvent(api=api, job=running, kind="throttled") for _ in range(FRESH_EVENTS)
    )
    _progress(f"loaded in {load_seconds:.0f} s; VACUUM (ANALYZE) and CHECKPOINT")
    with connection.cursor() as cursor:
        for model in (Call, ThrottleEvent, JobSecond, Job):
            cursor.execute(f"VACUUM (ANALYZE) {connection.ops.quote_name(model._meta.db_table)}")
        # The load's gigabytes written out now, not by a checkpoint in the middle of a phase:
        # rows 40 days old were written long ago.
        cursor.execute("CHECKPOINT")
    call_ids = list(Call.objects.filter(job=running).values_list("pk", flat=True))
    return old, running, call_ids


def probe(
    stop: threading.Event, watched: Watch, *, api_id: int, job_id: int, call_ids: list[int]
) -> None:
    """A worker's writes on its own job: one call's row, then a new throttle event."""
    from django.db import connection
    from django.db.models import F

    from ratejobs.models import Call, ThrottleEvent

    writes: list[Callable[[], Any]] = [
        lambda: Call.objects.filter(pk=random.choice(call_ids)).update(attempts=F("attempts") + 1),
        lambda: ThrottleEvent.objects.create(
            api_id=api_id, job_id=job_id, kind="throttled", status_code=429
        ),
    ]
    try:
        while not stop.is_set():
            for write in writes:
                began = time.perf_counter()
                try:
                    write()
                except Exception as exc:  # counted and shown: a failed write is a finding
                    watched.probe_errors.append(f"{type(exc).__name__}: {exc}"[:200])
                ended = time.perf_counter()
                watched.probes.append((ended, ended - began))
            stop.wait(PROBE_PAUSE_SECONDS)
    finally:
        connection.close()


def sample(stop: threading.Event, watched: Watch, *, retention_pid: int) -> None:
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            while not stop.wait(SAMPLE_SECONDS):
                # pg_locks covers the whole server: only this database's backends count
                cursor.execute(
                    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - l.waitstart)), 0) "
                    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE NOT l.granted AND l.waitstart IS NOT NULL "
                    "AND a.datname = current_database()"
                )
                now = time.perf_counter()
                watched.lock_waits.append((now, float(cursor.fetchone()[0])))
                cursor.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU') "
                    "FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
                    "AND pid NOT IN (pg_backend_pid(), %s) "
                    "AND clock_timestamp() - query_start > %s * interval '1 second'",
                    [retention_pid, SLOW_SECONDS],
                )
                watched.slow_waits += [(now, row[0]) for row in cursor.fetchall()]
                cursor.execute(
                    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0) "
                    "FROM pg_stat_activity WHERE pid = %s AND backend_xid IS NOT NULL",
                    [retention_pid],
                )
                watched.transactions.append((now, float(cursor.fetchone()[0])))
    finally:
        connection.close()


def run_phases(old: Any, batch_size: int) -> list[Phase]:
    """A quiet spell first, the probe alone: the machine's own noise, to read the rest against."""
    from ratejobs.services.retention import (
        call_bodies_remove_old,
        job_purge,
        throttle_events_remove_old,
    )

    steps: list[tuple[str, Callable[[], Any]]] = [
        (
            f"throttle events older than {KEEP_DAYS} days",
            lambda: throttle_events_remove_old(days=KEEP_DAYS, batch_size=batch_size),
        ),
        (
            f"response bodies of jobs finished over {KEEP_DAYS} days ago",
            lambda: call_bodies_remove_old(days=KEEP_DAYS, batch_size=batch_size),
        ),
        (
            "purge of the old job (calls, counts, job)",
            lambda: job_purge(job=old, batch_size=batch_size),
        ),
    ]
    wal, checkpoints = server_counters()
    began = time.perf_counter()
    time.sleep(BASELINE_SECONDS)
    wal_after, checkpoints_after = server_counters()
    phases = [
        Phase(
            "nothing: the probe alone",
            0,
            0,
            0.0,
            began,
            time.perf_counter(),
            wal_after - wal,
            checkpoints_after - checkpoints,
        )
    ]
    for name, step in steps:
        _progress(f"running: {name}")
        wal, checkpoints = server_counters()
        began = time.perf_counter()
        removed = step()
        ended = time.perf_counter()
        wal_after, checkpoints_after = server_counters()
        if not removed.done:
            raise BenchError(f"{name}: stopped before the end")
        phases.append(
            Phase(
                name,
                removed.rows,
                removed.batches,
                removed.longest_batch,
                began,
                ended,
                wal_after - wal,
                checkpoints_after - checkpoints,
            )
        )
        _progress(
            f"{name}: {removed.rows:,} rows in {removed.batches:,} batches, {ended - began:.1f} s"
        )
    return phases


def check(old: Any, running: Any, rows: int) -> None:
    """What must be left: the running job whole, the fresh events, nothing of the old job."""
    from ratejobs.models import Call, Job, JobSecond, ThrottleEvent

    left = (
        Job.objects.filter(pk=old.pk).count(),
        Call.objects.filter(job_id=old.pk).count(),
        ThrottleEvent.objects.filter(job_id=old.pk).count(),
        JobSecond.objects.filter(job_id=old.pk).count(),
    )
    if left != (0, 0, 0, 0):
        raise BenchError(f"the old job left rows behind: {left}")
    if Call.objects.filter(job=running).count() != RUNNING_JOB_CALLS:
        raise BenchError("calls of the running job were removed")
    if ThrottleEvent.objects.filter(job=running).count() < FRESH_EVENTS:
        raise BenchError("fresh throttle events were removed")


def _within(samples: list[tuple[float, float]], phase: Phase) -> list[float]:
    return [value for at, value in samples if phase.began <= at <= phase.ended]


def render(phases: list[Phase], watched: Watch, args: argparse.Namespace, about: str) -> str:
    lines = [
        "| phase | rows removed | batches | total time | mean batch | longest batch transaction | "
        "probe writes | longest probe wait | probe p99 | longest lock wait (pg_locks) | "
        "longest writing retention transaction (pg_stat_activity) | WAL (server) | "
        "checkpoints |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    worst = 0.0
    notes: list[str] = []
    for phase in phases:
        probes = _within(watched.probes, phase)
        waits = _within(watched.lock_waits, phase) or [0.0]
        open_for = _within(watched.transactions, phase) or [0.0]
        longest = max(probes, default=0.0)
        worst = max(worst, longest)
        p99 = statistics.quantiles(probes, n=100)[98] if len(probes) >= 2 else longest
        batches = (
            f"{phase.rows:,} | {phase.batches:,} | {phase.ended - phase.began:.1f} s | "
            f"{(phase.ended - phase.began) / phase.batches * 1000:.0f} ms | "
            f"{phase.longest_batch * 1000:.0f} ms"
            if phase.batches
            else f"— | — | {phase.ended - phase.began:.1f} s | — | —"
        )
        lines.append(
            f"| {phase.name} | {batches} | "
            f"{len(probes):,} | {longest * 1000:.0f} ms | {p99 * 1000:.1f} ms | "
            f"{max(waits) * 1000:.0f} ms | {max(open_for) * 1000:.0f} ms | "
            f"{phase.wal_bytes / 2**20:,.0f} MiB | {phase.checkpoints} |"
        )
        slow = Counter(
            event for at, event in watched.slow_waits if phase.began <= at <= phase.ended
        )
        if slow:
            notes.append(
                f"{phase.name}: probe statements seen running over "
                f"{SLOW_SECONDS * 1000:.0f} ms were waiting on "
                + ", ".join(f"{event} ({n})" for event, n in slow.most_common())
            )
    verdict = "holds" if worst < BUDGET_SECONDS and not watched.probe_errors else "BROKEN"
    lines += [
        "",
        f"Longest probe wait {worst * 1000:.0f} ms against a budget of "
        f"{BUDGET_SECONDS * 1000:.0f} ms: {verdict}"
        + (
            f"; {len(watched.probe_errors)} probe writes failed, first: {watched.probe_errors[0]}"
            if watched.probe_errors
            else ""
        )
        + ".",
        *(f"- {note}." for note in notes),
        "",
        f"{args.rows:,} calls with {args.body_bytes:,}-byte bodies in one job finished "
        f"{AGE_DAYS} days ago, {args.rows:,} throttle events as old, batches of "
        f"{args.batch_size:,} rows; the probe wrote on a running job of {RUNNING_JOB_CALLS:,} "
        f"calls (UPDATE a call, INSERT an event, {PROBE_PAUSE_SECONDS * 1000:.0f} ms apart), "
        f"pg_locks and pg_stat_activity sampled every {SAMPLE_SECONDS * 1000:.0f} ms; " + about,
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="calls, and events")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="rows per transaction (the service's own)"
    )
    parser.add_argument("--body-bytes", type=int, default=DEFAULT_BODY_BYTES)
    args = parser.parse_args(argv)
    if args.rows < 1 or (args.batch_size is not None and args.batch_size < 1):
        parser.error("--rows and --batch-size must be positive")
    with contextlib.ExitStack() as cleanup:
        setup = cleanup.enter_context(bench_setup())
        from django.db import connection

        from ratejobs.services.retention import BATCH_ROWS

        args.batch_size = args.batch_size or BATCH_ROWS
        if connection.vendor != "postgresql":
            raise BenchError("bench.retention measures PostgreSQL's locks: set DATABASE_URL")
        old, running, call_ids = load(args.rows, args.body_bytes, setup.owner)
        watched = Watch()
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=probe,
                args=(stop, watched),
                daemon=True,
                kwargs={"api_id": running.api_id, "job_id": running.pk, "call_ids": call_ids},
            ),
            threading.Thread(
                target=sample,
                args=(stop, watched),
                kwargs={"retention_pid": connection.connection.info.backend_pid},
                daemon=True,
            ),
        ]
        for thread in threads:
            thread.start()
        try:
            phases = run_phases(old, args.batch_size)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        check(old, running, args.rows)
        about = setup.about
    print(render(phases, watched, args, about))
    return 0


def _progress(message: str) -> None:
    print(f"[bench.retention] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
