"""Fixtures for the sandbox tests: in-process sandboxes that stop after the test, and a client."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import requests

from sandbox import Sandbox
from sandbox.server import CONNECTION_THREAD_PREFIX

# Log times are epoch floats, whose resolution at today's epoch is about 0.24 µs; a recomputed
# window bound allows that much per end.
LOG_TIME_SLACK_S = 1e-6


@pytest.fixture
def make_sandbox() -> Iterator[Callable[..., Sandbox]]:
    started: list[Sandbox] = []

    def make(**options: Any) -> Sandbox:
        sandbox = Sandbox(**options).start()
        started.append(sandbox)
        return sandbox

    yield make
    for sandbox in started:
        sandbox.stop()
    # expect of every test: a stopped sandbox leaves no connection thread behind
    leftovers = [t for t in threading.enumerate() if t.name.startswith(CONNECTION_THREAD_PREFIX)]
    assert not leftovers


@pytest.fixture
def session() -> Iterator[requests.Session]:
    client = requests.Session()
    client.trust_env = False  # straight to 127.0.0.1, whatever proxy the environment names
    yield client
    client.close()


def worst_window_excess(
    times: Sequence[float],
    *,
    rate: float,
    period: float,
    burst: int,
    weights: Sequence[int] | None = None,
) -> float:
    """Largest (units in [t_i, t_j]) - (burst + (t_j - t_i) * rate / period) over all pairs of
    the sorted `times`, each arrival one unit or its `weights` entry (tokens); <= 0 when every
    window keeps the bound."""
    units_of = [1] * len(times) if weights is None else weights
    worst = float("-inf")
    for i in range(len(times)):
        units = 0
        for j in range(i, len(times)):
            units += units_of[j]
            # widened, never narrowed, by each end's rounding (as tests/limiter's check does):
            # narrowed, an exactly conforming window read one rounding too short
            width = times[j] - times[i] + 2 * LOG_TIME_SLACK_S
            worst = max(worst, units - (burst + width * rate / period))
    return worst
