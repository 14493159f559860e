"""One benchmark worker process: build a contender, wait on the start barrier, take grants in a
loop for a fixed time and report when each came, how long each acquire took, and how many
Redis round trips the process made."""

from __future__ import annotations

import asyncio
import time
import traceback
from array import array
from dataclasses import dataclass, field
from typing import Any

import redis.connection

from bench.contenders import CONTENDERS, Gate

# Long enough for 8 spawned interpreters to import redis and a library on 2 busy cores.
BARRIER_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class Job:
    contender: str
    url: str
    prefix: str
    rate: int
    high: bool  # the unlimited run: the limit is far above what the machine can reach
    seconds: float


@dataclass
class Report:
    started: float  # time.time() when this process left the barrier
    granted_at: array = field(default_factory=lambda: array("d"))  # time.time() per grant
    latencies: array = field(default_factory=lambda: array("d"))  # seconds per acquire()
    round_trips: int = 0


@dataclass(frozen=True)
class Failure:
    traceback: str


class _RoundTrips:
    """Counts commands written to Redis: one send_packed_command call is one round trip, and a
    pipeline or a script is a single call."""

    count = 0

    @classmethod
    def install(cls) -> None:
        original = redis.connection.Connection.send_packed_command

        def counting(self: Any, command: Any, check_health: bool = True) -> Any:
            cls.count += 1
            return original(self, command, check_health)

        redis.connection.Connection.send_packed_command = counting  # type: ignore[method-assign]


def run(job: Job, barrier: Any, reports: Any) -> None:
    """Process entry point; puts one Report or Failure on `reports`."""
    try:
        _RoundTrips.install()
        contender = next(c for c in CONTENDERS if c.key == job.contender)
        gate = contender.build(job.url, job.prefix, job.rate, job.high)
        gate.connect()
        barrier.wait(BARRIER_TIMEOUT_SECONDS)
        report = Report(started=time.time())
        _RoundTrips.count = 0
        if gate.is_async:
            asyncio.run(_take_grants_async(gate, job, report))
        else:
            _take_grants(gate, job, report)
        report.round_trips = _RoundTrips.count
        gate.close()
        reports.put(report)
    except BaseException:
        barrier.abort()  # the other workers fail fast instead of waiting out the timeout
        reports.put(Failure(traceback.format_exc()))


def _take_grants(gate: Gate, job: Job, report: Report) -> None:
    deadline = report.started + job.seconds
    granted_at, latencies = report.granted_at, report.latencies
    while time.time() < deadline:
        before = time.perf_counter()
        gate.acquire()
        granted_at.append(time.time())
        latencies.append(time.perf_counter() - before)
        gate.release()


async def _take_grants_async(gate: Gate, job: Job, report: Report) -> None:
    deadline = report.started + job.seconds
    granted_at, latencies = report.granted_at, report.latencies
    while time.time() < deadline:
        before = time.perf_counter()
        await gate.acquire()
        granted_at.append(time.time())
        latencies.append(time.perf_counter() - before)
        gate.release()
