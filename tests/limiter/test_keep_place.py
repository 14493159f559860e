"""A large call keeps its place (P5): one whose cost is near a window's burst is not starved by a
steady stream of small calls that take whatever refills within their wait, and one that can
never fit is refused with that reason (P3)."""

from __future__ import annotations

import threading
import time

import pytest

from ratejobs.limiter import LimiterConfig, TooBig, WaitTooLong, Window
from tests.limiter.conftest import worst_window_excess

# The window: 100 units a second, a burst of 200; a cost-200 call needs the whole burst,
# 2 s of refill, and the worker waits at most a second.
RATE, BURST, MAX_WAIT = 100.0, 200, 1.0
CONFIG = LimiterConfig(rate=10_000.0, burst=1000, windows=(Window(RATE, 1.0, BURST, "cost"),))
SMALL, LARGE, SMALL_THREADS = 5, 200, 3
# How long the small callers keep the window busy at most: twice what the large call may take.
STREAM_SECONDS = 8.0


@pytest.mark.slow
def test_a_burst_sized_call_is_granted_among_a_steady_stream_of_small_ones(make_limiter):
    # given threads taking cost-5 calls as fast as the window refills, each asking again soon
    # after a TOO_LONG (as calls of a busy job come back), so the window stays nearly full
    limiter = make_limiter(CONFIG)
    grants: list[tuple[int, int]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def small_stream() -> None:
        while not stop.is_set():
            try:
                grant = limiter.acquire(cost=SMALL, max_wait=MAX_WAIT)
            except WaitTooLong as exc:
                time.sleep(min(exc.retry_after, 0.05))
                continue
            with lock:
                grants.append((grant.slot_us, SMALL))

    threads = [threading.Thread(target=small_stream) for _ in range(SMALL_THREADS)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # the stream has spent the burst and runs at the window's rate
        # when a cost-200 call asks as a worker does: a second's wait, keeping its place
        asked = time.monotonic()
        refused = 0
        grant = None
        while grant is None and time.monotonic() - asked < STREAM_SECONDS:
            try:
                grant = limiter.acquire(cost=LARGE, max_wait=MAX_WAIT, keep_place=True)
            except WaitTooLong as exc:
                if exc.place is not None:
                    # the worker hands the place on and confirms it when it comes
                    grant = limiter.confirm(exc.place)
                else:
                    refused += 1
                    time.sleep(min(exc.retry_after, 0.05))
        took = time.monotonic() - asked
    finally:
        stop.set()
        for t in threads:
            t.join()
    # expect: it was granted within twice the 2 s its cost takes to refill at the window's
    # rate (a second of small calls already promised ahead of it, then its own 2 s)
    assert grant is not None, f"refused {refused} times in {STREAM_SECONDS}s"
    assert took <= 2 * LARGE / RATE, took
    grants.append((grant.slot_us, LARGE))
    # and no stretch of the grants took more than the window allows, the large call with them
    slots, costs = zip(*grants, strict=True)
    assert worst_window_excess(slots, costs, rate=RATE, period=1.0, burst=BURST) <= 0
    assert len(grants) > SMALL_THREADS * 10  # the small calls kept coming meanwhile


@pytest.mark.parametrize("keep_place", [False, True])
def test_a_call_larger_than_the_burst_is_refused_as_too_big(make_limiter, keep_place):
    # given a cost window of burst 200, and a limiter that knows it or only Redis does
    limiter = make_limiter(CONFIG)
    blind = make_limiter(None, name=limiter.name)
    for caller in (limiter, blind):
        # expect: a call of 201 is refused with the reason, not told to wait or kept in line
        with pytest.raises(TooBig, match="201 exceeds"):
            caller.acquire(cost=BURST + 1, max_wait=MAX_WAIT, keep_place=keep_place)
