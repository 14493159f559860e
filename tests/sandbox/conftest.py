"""Fixtures for the sandbox tests: in-process sandboxes that stop after the test, and a client."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import requests

from ratejobs.sandbox import Sandbox
from ratejobs.sandbox.server import CONNECTION_THREAD_PREFIX

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


def worst_window_excess(times: Sequence[float], *, rate: float, period: float, burst: int) -> float:
    """Largest (arrivals in [t_i, t_j]) - (burst + (t_j - t_i) * rate / period) over all pairs of
    the sorted `times`; <= 0 when every window keeps the bound."""
    worst = float("-inf")
    for i in range(len(times)):
        for j in range(i, len(times)):
            # widened, never narrowed, by each end's rounding (as tests/limiter's check does):
            # narrowed, an exactly conforming window read one rounding too short
            width = times[j] - times[i] + 2 * LOG_TIME_SLACK_S
            worst = max(worst, (j - i + 1) - (burst + width * rate / period))
    return worst
