"""Fixtures and checks shared by the limiter tests."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence

import pytest

from ratejobs.limiter import LimiterConfig
from tests.sandbox.conftest import make_sandbox  # noqa: F401 (a fixture of the adapters' tests)

# Slots are whole microseconds on Redis's clock, so two slots one interval apart can be up to
# 1 µs closer than the exact interval; the window bound is checked with that allowance.
SLOT_ROUNDING_US = 1


@pytest.fixture
def spawn() -> multiprocessing.context.SpawnContext:
    # spawn, not fork: a forked child would share the parent's Redis sockets.
    return multiprocessing.get_context("spawn")


def take_in_processes(
    spawn,
    taker,
    redis_url: str,
    name: str,
    count: int,
    weight: int,
    processes: int,
    timeout: float = 60,
    config: LimiterConfig | None = None,
) -> list:
    """Run `taker` (tests.limiter.workers) in `processes` processes started together, each
    taking `count` grants of `weight`; their reports (pid, grants, round trips)."""
    barrier, results = spawn.Barrier(processes), spawn.Queue()
    procs = [
        spawn.Process(
            target=taker,
            args=(redis_url, name, count, weight, barrier, results),
            kwargs={"config": config},
        )
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=timeout) for _ in range(processes)]
    for p in procs:
        p.join(10)
    return reports


def worst_window_excess(
    slots_us: Sequence[int], weights: Sequence[int], *, rate: float, period: float, burst: int
) -> float:
    """Largest (units granted in [t_i, t_j]) - (burst + (t_j - t_i) * rate / period) over all
    windows; <= 0 means the bound holds for every window (the worst windows start and end on a
    grant)."""
    pairs = sorted(zip(slots_us, weights, strict=True))
    worst = float("-inf")
    for i in range(len(pairs)):
        units = 0
        for j in range(i, len(pairs)):
            units += pairs[j][1]
            width = pairs[j][0] - pairs[i][0] + SLOT_ROUNDING_US
            worst = max(worst, units - (burst + width * rate / (period * 1_000_000)))
    return worst


def worst_count_in_window(times_us: Sequence[int], window_us: int) -> int:
    times = sorted(times_us)
    worst, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window_us:
            start += 1
        worst = max(worst, end - start + 1)
    return worst
