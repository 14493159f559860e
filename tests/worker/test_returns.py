"""The engine's lease returns: a place under an in-flight cap goes back as soon as its
response is in, many in one round trip, and a release wakes a caller waiting for a place."""

from __future__ import annotations

import threading
import time

from ratejobs.limiter import LimiterConfig
from ratejobs.services.calls import LeaseReturn
from ratejobs.worker.returns import LeaseReturns


def test_leases_go_back_in_one_round_trip_with_their_settles(make_limiter):
    # given a limiter with 5 places, all taken
    limiter = make_limiter(LimiterConfig(rate=1000, burst=10, max_concurrency=5))
    grants = list(limiter.acquire_many(5))
    assert limiter.state().in_flight == 5
    returns = LeaseReturns()
    trips = limiter.round_trips
    # when the five responses are in at once
    for grant in grants:
        returns.put(LeaseReturn(limiter, grant, None))
    # expect: every place is free again, in at most as many round trips as leases (one,
    # unless the thread woke between two of them)
    assert returns.stop(5.0)
    assert limiter.state().in_flight == 0
    assert 1 <= limiter.round_trips - trips <= 5


def test_a_returned_place_wakes_a_caller_waiting_for_it(make_limiter):
    # given one place, taken, and a caller waiting for it
    limiter = make_limiter(LimiterConfig(rate=1000, burst=10, max_concurrency=1))
    held = limiter.acquire()
    got: list[float] = []

    def wait_for_place() -> None:
        limiter_b = make_limiter()
        limiter_b.acquire(max_wait=10)
        got.append(time.monotonic())

    waiter = threading.Thread(target=wait_for_place)
    waiter.start()
    time.sleep(0.2)
    returns = LeaseReturns()
    # when the holder's response is in and its lease goes to the returns
    returned = time.monotonic()
    returns.put(LeaseReturn(limiter, held, None))
    waiter.join(10)
    returns.stop(5.0)
    # expect: the waiter got the place at once, not at its next poll (half a second)
    assert got and got[0] - returned < 0.25


def test_a_batch_at_capacity_comes_back_empty_without_waiting_for_room(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=1000, burst=10, max_concurrency=2))
    limiter.acquire_many(2)
    started = time.monotonic()
    batch = limiter.acquire_many(3, max_wait=5, wait_for_room=False)
    assert len(batch) == 0 and batch.retry_after > 0
    assert time.monotonic() - started < 0.5
