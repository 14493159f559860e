"""Compare our shared Redis limiter with what Celery's rate_limit, pyrate-limiter, limits and
aiolimiter give N worker processes that share one API's limit; prints one markdown table.

    python -m bench.limiter [--quick] [--processes N] [--seconds S] [--rate R] [--only KEY,...]

Each contender runs twice with N spawned processes released together by a barrier: once at the
configured rate (how well the limit holds, what it costs in Redis round trips) and once with a
limit so high that nobody waits (the cost of one acquire, and the most grants per second).
Progress goes to stderr, the table to stdout. Redis is REDIS_URL or redis://127.0.0.1:6379/0;
when nothing answers there, a private redis-server is started for the run (devtools.devredis).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from bench import worker
from bench.contenders import API_BURST, CONTENDERS, Contender
from bench.worker import Failure, Job, Report
from devtools import devredis
from sandbox.process import worst_window

# A modest fleet of Celery workers calling one API; more than the 2 cores, as in production.
DEFAULT_PROCESSES = 8
# Long enough that start-up bursts do not dominate the averages; 8 contenders x 2 runs of 5 s
# plus process start-up keep the whole benchmark to a few minutes.
DEFAULT_SECONDS = 5.0
# --quick: a smoke run that shows every contender still works.
QUICK_SECONDS = 1.0
# Requests per second the API allows: 500 grants in a 5 s run, many 1 s windows to compare, and
# low enough that every contender, polling ones included, keeps up on 2 cores.
DEFAULT_RATE = 100
# The unlimited run's limit: far above what N processes on this machine can reach, so no
# contender ever has to wait and the run measures only the cost of asking.
HIGH_RATE = 1_000_000
WINDOW_SECONDS = 1.0
# A per-second count hides bursts; a tenth of a second shows them.
SHORT_WINDOW_SECONDS = 0.1
KEY_PREFIX = "ratejobs-bench"
# Past the run itself: spawning, importing and the slowest worker's last wait.
COLLECT_GRACE_SECONDS = 60.0
PERCENTILES = (0.50, 0.99)


@dataclass(frozen=True)
class Settings:
    processes: int
    seconds: float
    rate: int
    url: str


@dataclass(frozen=True)
class Run:
    """What all processes of one run reported, merged."""

    reports: list[Report]
    seconds: float

    @property
    def start(self) -> float:
        return min(r.started for r in self.reports)

    @property
    def grant_times(self) -> list[float]:
        return sorted(t for r in self.reports for t in r.granted_at)

    @property
    def grants(self) -> int:
        return sum(len(r.granted_at) for r in self.reports)

    @property
    def round_trips_per_grant(self) -> float:
        return sum(r.round_trips for r in self.reports) / max(1, self.grants)

    def grants_per_second(self) -> float:
        """Grants stamped within the run's nominal span, per second of it."""
        end = self.start + self.seconds
        in_run = sum(1 for r in self.reports for t in r.granted_at if t < end)
        return in_run / self.seconds

    def latency_percentiles(self) -> list[float]:
        ordered = sorted(x for r in self.reports for x in r.latencies)
        return [ordered[min(len(ordered) - 1, int(p * len(ordered)))] for p in PERCENTILES]


@dataclass(frozen=True)
class Limited:
    """What the run at the configured rate showed: how well the limit held."""

    achieved: float
    worst_window: int
    worst_short_window: int
    round_trips: float


@dataclass(frozen=True)
class Row:
    contender: Contender
    rate: int
    limited: Limited | None  # None for the floor, which limits nothing
    round_trips_unlimited: float
    latency_p50: float
    latency_p99: float
    max_grants_per_second: float


class BenchError(RuntimeError):
    pass


def bound(rate: int, width: float) -> int:
    return int(rate * width) + API_BURST


def run_processes(
    contender: Contender, settings: Settings, prefix: str, rate: int, high: bool
) -> Run:
    if contender.prepare is not None:
        contender.prepare(settings.url, prefix, rate, high)
    _warm_up(contender, settings.url, f"{prefix}:warmup", rate, high)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(settings.processes)
    queue = context.Queue()
    job = Job(contender.key, settings.url, prefix, rate, high, settings.seconds)
    processes = [
        context.Process(target=worker.run, args=(job, barrier, queue), name=f"bench-{i}")
        for i in range(settings.processes)
    ]
    for process in processes:
        process.start()
    try:
        timeout = worker.BARRIER_TIMEOUT_SECONDS + settings.seconds + COLLECT_GRACE_SECONDS
        results = [queue.get(timeout=timeout) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=COLLECT_GRACE_SECONDS)
            if process.is_alive():
                process.terminate()
                process.join()
    failures = [r for r in results if isinstance(r, Failure)]
    if failures:
        raise BenchError(f"{contender.key}: a worker failed:\n{failures[0].traceback}")
    return Run(reports=results, seconds=settings.seconds)


def _warm_up(contender: Contender, url: str, prefix: str, rate: int, high: bool) -> None:
    """One grant on a throwaway key, so each library's Lua scripts are in Redis's cache before
    the workers start, as they are in any long-running deployment."""
    if contender.prepare is not None:
        contender.prepare(url, prefix, rate, high)
    gate = contender.build(url, prefix, rate, high)
    try:
        result = gate.acquire()
        if gate.is_async:
            asyncio.run(result)
        gate.release()
    finally:
        gate.close()


def bench_contender(contender: Contender, settings: Settings, prefix: str) -> Row:
    limited = None
    if contender.limits:
        _progress(f"{contender.key}: {settings.rate}/s for {settings.seconds:g} s")
        run = run_processes(contender, settings, f"{prefix}:limited", settings.rate, False)
        limited = Limited(
            achieved=run.grants_per_second(),
            worst_window=worst_window(run.grant_times, WINDOW_SECONDS),
            worst_short_window=worst_window(run.grant_times, SHORT_WINDOW_SECONDS),
            round_trips=run.round_trips_per_grant,
        )
    _progress(f"{contender.key}: {HIGH_RATE:,}/s for {settings.seconds:g} s")
    unlimited = run_processes(contender, settings, f"{prefix}:unlimited", HIGH_RATE, True)
    p50, p99 = unlimited.latency_percentiles()
    return Row(
        contender=contender,
        rate=settings.rate,
        limited=limited,
        round_trips_unlimited=unlimited.round_trips_per_grant,
        latency_p50=p50,
        latency_p99=p99,
        max_grants_per_second=unlimited.grants_per_second(),
    )


def delete_keys(client: redis.Redis, pattern: str) -> int:
    keys = list(client.scan_iter(match=pattern, count=1000))
    return client.delete(*keys) if keys else 0


def render(rows: Sequence[Row], settings: Settings, redis_version: str, load: float) -> str:
    rate = settings.rate
    long_bound, short_bound = bound(rate, WINDOW_SECONDS), bound(rate, SHORT_WINDOW_SECONDS)
    lines = [
        "| library / strategy | configured | achieved /s | worst 1 s window "
        f"(bound {long_bound}) | worst 100 ms window (bound {short_bound}) | "
        "Redis round trips / grant (limited / unlimited) | acquire p50 / p99, no wait | "
        f"max grants/s (limit {HIGH_RATE:,}/s) |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    floor = next((row for row in rows if row.limited is None), None)
    for row in rows:
        scope = "shared" if row.contender.shared else "per process"
        limited = row.limited
        if limited is None:
            held = "none | — | — | — | —"
        else:
            held = (
                f"{row.rate}/s {scope} | {limited.achieved:.1f} | "
                f"{_against(limited.worst_window, long_bound)} | "
                f"{_against(limited.worst_short_window, short_bound)} | "
                f"{limited.round_trips:.2f}"
            )
        most = f"{row.max_grants_per_second:,.0f}"
        if floor is not None and row is not floor and floor.max_grants_per_second > 0:
            most += f" ({row.max_grants_per_second / floor.max_grants_per_second:.2f} of floor)"
        lines.append(
            f"| {row.contender.label} | {held} / {row.round_trips_unlimited:.2f} | "
            f"{_micros(row.latency_p50)} / {_micros(row.latency_p99)} | {most} |"
        )
    lines += [
        "",
        f"N = {settings.processes} processes (spawn), each with its own Redis client and "
        f"limiter, released together by a barrier; {settings.seconds:g} s per run; "
        f"Redis {redis_version}; {os.cpu_count()} cores, load average {load:.2f} at the start.",
        "",
        f"- *configured*: the limit each contender was given, {rate} requests per 1 s: shared "
        f"through Redis, or per process (what the local libraries give N processes).",
        f"- *achieved*: grants per second over the {settings.seconds:g} s run, all processes.",
        "- *worst window*: the most grants in any window [t, t + w) over the merged "
        "`time.time()` stamps taken right after acquire returned, in every process; "
        f"bound = rate x w + burst = {rate} x w + {API_BURST} (the API allows {rate}/s, one "
        "request at a time); bold = over the bound.",
        "- *round trips*: `send_packed_command` calls (a script or a pipeline is one) in all "
        "workers / grants, in the limited run and in the unlimited one; connections are opened "
        "and Lua scripts loaded before the start. Local libraries make none.",
        f"- *acquire p50 / p99* and *max grants/s*: the unlimited run (limit {HIGH_RATE:,}/s), "
        "where nobody has to wait: the duration of one acquire call, and grants per second "
        f"from {settings.processes} processes sharing the cores with Redis; *of floor*: that "
        "figure over the floor row's, when it ran.",
    ]
    lines += [f"- {row.contender.label}: {row.contender.note}." for row in rows]
    return "\n".join(lines)


def _against(value: int, limit: int) -> str:
    return f"**{value}**" if value > limit else str(value)


def _micros(seconds: float) -> str:
    micros = seconds * 1_000_000
    return f"{micros:.1f} µs" if micros < 10 else f"{micros:,.0f} µs"


def _progress(message: str) -> None:
    print(f"[bench.limiter] {message}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.limiter", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SECONDS:g} s runs")
    parser.add_argument("--processes", type=int, default=DEFAULT_PROCESSES)
    parser.add_argument("--seconds", type=float, default=None, help="length of each run")
    parser.add_argument(
        "--rate", type=int, default=DEFAULT_RATE, help="requests per second (whole number)"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated contenders: " + ",".join(c.key for c in CONTENDERS),
    )
    args = parser.parse_args(argv)
    if args.processes < 1 or args.rate < 1 or (args.seconds is not None and args.seconds <= 0):
        parser.error("--processes, --rate and --seconds must be positive")
    known = {c.key for c in CONTENDERS}
    if unknown := set(filter(None, args.only.split(","))) - known:
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else DEFAULT_SECONDS)
    only = set(filter(None, args.only.split(",")))
    contenders = [c for c in CONTENDERS if not only or c.key in only]
    load = os.getloadavg()[0]
    server = devredis.ensure(os.environ.get("REDIS_URL", devredis.DEFAULT_URL))
    if server.started_here:
        _progress(f"no Redis answered; started a private one at {server.url}")
    settings = Settings(args.processes, seconds, args.rate, server.url)
    client = redis.Redis.from_url(settings.url)
    run_prefix = f"{KEY_PREFIX}:{os.getpid()}-{time.time_ns()}"
    rows = []
    try:
        redis_version = client.info("server")["redis_version"]
        for contender in contenders:
            rows.append(bench_contender(contender, settings, f"{run_prefix}:{contender.key}"))
    finally:
        deleted = delete_keys(client, f"{run_prefix}:*")
        _progress(f"deleted {deleted} Redis keys under {run_prefix}:")
        client.close()
        server.stop()
    print(render(rows, settings, redis_version, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
