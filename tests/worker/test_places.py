"""Calls waiting in a worker for a place under an in-flight cap: one thread per limiter takes
places for them as releases come, in one round trip for as many as are waiting."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from ratejobs.limiter import LimiterConfig
from ratejobs.services.calls import Claimed
from ratejobs.worker.places import PlaceQueue


def claimed(limiter, index: int) -> Claimed:
    call = SimpleNamespace(cost=0, pk=index)
    context = SimpleNamespace(limiter=limiter, policy=SimpleNamespace(lease_seconds=30.0))
    return Claimed(call, f"token-{index}", context)


def test_waiting_calls_start_as_places_come_back_and_give_up_after_the_wait(make_limiter):
    # given an API with 2 places, both taken, and 3 calls waiting in this process
    limiter = make_limiter(LimiterConfig(rate=1000, burst=10, max_concurrency=2))
    held = list(limiter.acquire_many(2))
    started: list[tuple[float, Claimed]] = []
    lock = threading.Lock()

    def start(item: Claimed) -> None:
        with lock:
            started.append((time.monotonic(), item))

    places = PlaceQueue(start, max_wait=1.0)
    for i in range(3):
        places.add(claimed(limiter, i))
    time.sleep(0.2)
    assert started == []  # nothing free: nobody goes
    # when one place comes back
    freed = time.monotonic()
    limiter.release(held[0])
    deadline = time.monotonic() + 2
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    # expect: the first call goes at once, with the place reserved for it
    assert len(started) == 1 and started[0][1].call.pk == 0
    assert started[0][0] - freed < 0.3 and started[0][1].reserved is not None
    # and the others, when no place comes within their wait, start without one (each then
    # asks on its own and records that none came)
    time.sleep(1.2)
    assert [item.call.pk for _, item in started] == [0, 1, 2]
    assert [item.reserved is None for _, item in started[1:]] == [True, True]
    assert limiter.state().in_flight == 2
