"""What a row of the scale run measures once its job ended: the sandbox's arrivals (on the
services host's clock, never a worker's), the calls' final states in the database, and the
workers' logs."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.jobs import LIMITER_COMMANDS
from bench.scale.hosts import HostProcess
from bench.scale.rows import API_BURST, LIMIT, PACE_FLOOR, SANDBOX_BURST, START_SLACK_SECONDS, Row
from sandbox.process import worst_window

# A Celery task "received" and "succeeded" further apart than this was held (an ETA) beyond
# the debounce (0.25 s) and its run.
HELD_SECONDS = 1.0
# The job's end and its last call's are written in one transaction: further apart than this,
# they were read on different clocks.
FINISHED_APART_SECONDS = 1.0
# After a fault, its arrivals are looked at over this long.
AFTER_FAULT_SECONDS = 15.0
# Redis commands a row's note names, the most frequent first.
TOP_COMMANDS = 8
# What a pool process logs when the row's end stops its worker (SIGTERM to the whole group).
STOPPED = "exited with 'signal 15 (SIGTERM)'"


def count_arrivals(row: Row, stats: Mapping[str, Any], due: float) -> None:
    """Arrivals, 429s, duplicates (a call's path answered more than once), the pace and the
    start after `due` (an epoch on this host's clock), from the sandbox's log of the row."""
    log = stats["log"]
    if stats.get("log_dropped"):
        row.problems.append(f"the sandbox's log dropped {stats['log_dropped']} arrivals")
    # A request whose Idempotency-Key the sandbox had answered gets that answer again (a
    # replay), or a 409 while the first is being answered (a conflict): it reached the sandbox,
    # which did not act on it, and is not in its log.
    replays = stats.get("idempotent_replays", 0) + stats.get("idempotent_conflicts", 0)
    row.arrivals, row.throttled = stats["arrivals"] + replays, stats["throttled"]
    admitted = [entry for entry in log if entry["status"] != 429]
    paths = Counter(entry["path"] for entry in admitted)
    if any(not path.startswith("/items/") for path in paths):
        row.problems.append("requests of no call of this row reached the sandbox")
    row.effective = sum(n - 1 for n in paths.values())
    row.duplicates = row.effective + replays
    times = sorted(entry["t"] for entry in admitted)
    if len(times) > 1:
        span = times[-1] - times[0]
        row.pace = (len(times) - 1) / span / LIMIT if span else None
        row.longest_gap = max(b - a for a, b in zip(times, times[1:], strict=False))
        if os.environ.get("BENCH_SCALE_TRACE"):
            per_second = Counter(int(t - times[0]) for t in times)
            print(
                f"[scale] {row.scenario.name}: admitted per second: "
                + " ".join(str(per_second[i]) for i in range(int(span) + 1)),
                file=sys.stderr,
                flush=True,
            )
    if times:
        row.late_start = times[0] - due
        if row.late_start > START_SLACK_SECONDS:
            row.problems.append(
                f"the first call arrived {row.late_start:.1f} s after the job was due"
            )
    # A 429's Retry-After holds every client (the quota is shared), whatever its clock says.
    inside = stats.get("retry_after_violations", 0)
    if inside:
        row.problems.append(f"{inside} requests arrived inside a Retry-After window")
    elif row.throttled:
        row.notes.append(
            f"no request arrived inside the Retry-After of any of the {row.throttled} 429s"
        )
    if row.throttled and row.scenario.fault is None:
        row.problems.append(f"{row.throttled} requests answered 429")
    elif row.throttled:
        # Not guaranteed across a fault: after a failover the new master may lack the last
        # reservations (docs/operations.md, "Redis Sentinel"); a request held in a cut-off
        # host's socket arrives when the link is back, long after its slot.
        row.notes.append(f"{row.throttled} requests answered 429 after the fault (not failed)")
    if row.effective:
        row.problems.append(f"{row.effective} calls acted on by the sandbox more than once")
    if row.duplicates and row.scenario.fault is None:
        row.problems.append(f"{row.duplicates} requests repeated a call without a fault")
    elif row.duplicates:
        row.notes.append(
            f"{row.duplicates} requests repeated a call, each answered again by its "
            "Idempotency-Key (a call taken over from a worker presumed dead)"
        )
    if row.scenario.judges_pace and (row.pace is None or row.pace < PACE_FLOOR):
        pace = "none" if row.pace is None else f"{row.pace:.3f}"
        row.problems.append(f"pace {pace} of the limit, under {PACE_FLOOR}")


def check_calls(row: Row, job_id: int) -> None:
    """Every call in exactly one final state, counted once in the job, all succeeded; and the
    job's end stamped on the database's clock, as its calls' are."""
    from django.db.models import Count, Max

    from ratejobs.models import Call, Job

    job = Job.objects.get(pk=job_id)
    by_status = dict(
        Call.objects.filter(job_id=job_id).values_list("status").annotate(n=Count("pk"))
    )
    if job.status != Job.Status.COMPLETED:
        row.problems.append(f"job {job.status}, not completed")
    counted = {status: getattr(job, status) for status in Call.FINAL}
    if any(counted[s] != by_status.get(s, 0) for s in Call.FINAL) or job.total != row.calls:
        row.problems.append(f"the job counts {counted} of {job.total}, its calls are {by_status}")
    succeeded = by_status.get(Call.Status.SUCCEEDED, 0)
    if succeeded != row.calls:
        row.problems.append(f"{row.calls - succeeded} calls did not succeed: {by_status}")
    # The job completes in the transaction that records its last call (calls_record_outcomes).
    last = Call.objects.filter(job_id=job_id).aggregate(last=Max("finished"))["last"]
    if job.finished is not None and last is not None:
        apart = (job.finished - last).total_seconds()
        if abs(apart) > FINISHED_APART_SECONDS:
            row.notes.append(
                f"the job's `finished` is {apart:+.1f} s from its last call's: stamped on the "
                "completing worker's clock, the calls' on the database's"
            )


def database_clients() -> list[str]:
    """The addresses connected to the database now, each with its number of connections: the
    hosts really are apart, and what each holds (behind PgBouncer, only its own address)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT client_addr, count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND client_addr IS NOT NULL GROUP BY 1"
        )
        counts = {str(address): n for address, n in cursor.fetchall()}
    ordered = sorted(counts, key=lambda a: tuple(int(part) for part in a.split(".")))
    return [f"{address} ({counts[address]})" for address in ordered]


def database_connections() -> int:
    """Connections to the row's database now, the run's own included."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


def cache_failures(row: Row, console: Path) -> None:
    """The web processes' warnings that a throttle's cache failed (it then counts nothing)."""
    text = console.read_text(errors="replace") if console.exists() else ""
    failed = [line for line in text.splitlines() if "the cache failed" in line]
    if failed:
        row.problems.append(f"the web's cache failed {len(failed)} times, first: {failed[0][:200]}")


def read_logs(row: Row, processes: Sequence[HostProcess]) -> None:
    """Errors in the row's worker and beat logs, Celery's clock drift warning, and how long
    dispatch tasks waited between arriving at a worker and running."""
    ran: list[float] = []
    never = 0
    errors: list[str] = []
    drift = ""
    for process in processes:
        text = process.text()
        errors += [
            line
            for line in text.splitlines()
            if (": ERROR/" in line or "CRITICAL/" in line) and STOPPED not in line
        ]
        held, waiting = task_holds(text, "ratejobs.dispatch")
        ran += held
        never += waiting
        drift = drift or next((line for line in text.splitlines() if "drift" in line), "")
    if ran:
        late = [seconds for seconds in ran if seconds > HELD_SECONDS]
        row.notes.append(
            f"dispatch tasks: {len(ran) + never} received, {len(late)} ran over "
            f"{HELD_SECONDS:g} s after arriving (longest {max(ran):.1f} s), {never} never ran "
            "(held for their ETA until the worker stopped)"
        )
    if drift:
        row.notes.append(f"celery: {drift.split('] ', 1)[-1][:160]}")
    if errors:
        row.notes.append(f"worker logs: {len(errors)} ERROR lines, first: {errors[0][:240]}")


def task_holds(log: str, task: str) -> tuple[list[float], int]:
    """Seconds from each `task` message's "received" to its "succeeded" line in one worker's
    log (both stamped by its own clock, so an offset cancels out), and how many were received
    and never run (held for their ETA when the worker stopped, and given back to the broker)."""
    received: dict[str, datetime.datetime] = {}
    held = []
    for line in log.splitlines():
        if f"Task {task}[" not in line or not line.startswith("["):
            continue
        stamp, _, rest = line[1:].partition(": ")
        task_id = rest.partition(f"{task}[")[2].partition("]")[0]
        with contextlib.suppress(ValueError):
            moment = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
            if rest.endswith(" received"):
                received[task_id] = moment
            elif " succeeded in " in rest and task_id in received:
                held.append((moment - received.pop(task_id)).total_seconds())
    return held, len(received)


def after_fault(row: Row, stats: Mapping[str, Any], struck_at: float, apis: int = 1) -> None:
    """Requests over the pace just after a fault (`struck_at`, an epoch on this host's clock,
    as the sandbox's log): the most admitted in any one second of the AFTER_FAULT_SECONDS after
    it, against the limit and the bursts (`apis` APIs sharing the limit, a burst each). Not
    failed on: after a failover the new master may
    lack the last reservations, and requests held in a cut-off host's sockets arrive late."""
    times = sorted(
        entry["t"]
        for entry in stats["log"]
        if entry["status"] != 429 and struck_at <= entry["t"] < struck_at + AFTER_FAULT_SECONDS
    )
    row.notes.append(
        f"in the {AFTER_FAULT_SECONDS:g} s after the fault: {len(times):,} admitted arrivals, "
        f"at most {worst_window(times, 1.0)} in any 1 s (the limit {LIMIT:g}/s with "
        + ("the API's burst" if apis == 1 else f"{apis} APIs' bursts")
        + f" of {API_BURST}: {LIMIT + apis * API_BURST:g}; the sandbox refuses beyond "
        f"{LIMIT + SANDBOX_BURST:g})"
    )


def redis_snapshot(clients: Sequence[Any]) -> dict[str, int]:
    """The Redis servers' command counts so far (by command, summed over `clients`; commands
    run inside scripts and functions count too) and their network bytes in and out."""
    counts: Counter[str] = Counter()
    for client in clients:
        stats = client.info("stats")
        counts.update(
            {
                name.removeprefix("cmdstat_"): int(entry["calls"])
                for name, entry in client.info("commandstats").items()
            }
        )
        counts.update(
            {" in": int(stats["total_net_input_bytes"]),
             " out": int(stats["total_net_output_bytes"])}
        )  # fmt: skip
    return dict(counts)


def redis_per_call(
    row: Row, where: str, before: Mapping[str, int], after: Mapping[str, int]
) -> None:
    """Redis operations per call over the job (the servers' own counts, between `before` and
    `after`), the limiter's function calls among them, and the bytes. A function's own
    commands (TIME, HGET, HINCRBY, ...) are counted as commands too: they are work on the
    server, not round trips."""
    spent = {name: after[name] - before.get(name, 0) for name in after}
    net_in, net_out = spent.pop(" in"), spent.pop(" out")
    spent = {name: n for name, n in spent.items() if n > 0}
    total = sum(spent.values())
    limiter = sum(spent.get(name, 0) for name in LIMITER_COMMANDS)
    top = sorted(spent.items(), key=lambda item: -item[1])[:TOP_COMMANDS]
    per = row.calls
    row.notes.append(
        f"Redis commands per call{' ' + where if where else ''}: {total / per:.1f}, the "
        f"limiter's function calls and waits {limiter / per:.2f} of them (by command: "
        + ", ".join(f"{name.upper()} {n / per:.2f}" for name, n in top)
        + f"); bytes per call {net_in / per:,.0f} in, {net_out / per:,.0f} out"
    )
