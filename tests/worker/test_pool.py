"""CallPool: room reserved before calls are claimed, and gathered into batches on a full pool."""

from __future__ import annotations

import threading

from ratejobs.worker.pool import CallPool


def test_reserve_gives_what_is_free_and_no_more():
    pool = CallPool(4)
    assert pool.reserve(3) == 3
    assert pool.reserve(3) == 1
    assert pool.reserve(1, timeout=0.01) == 0
    pool.unreserve(4)
    assert pool.busy == 0


def test_on_a_full_pool_a_reservation_gathers_places_freed_one_by_one():
    # given: a full pool whose calls end one by one
    pool = CallPool(8)
    ends = [threading.Event() for _ in range(8)]
    assert pool.reserve(8) == 8
    for end in ends:
        pool.run(end.wait)

    def end_calls() -> None:
        for end in ends[:5]:
            end.set()
            threading.Event().wait(0.005)

    ender = threading.Thread(target=end_calls)
    ender.start()
    # when: a message of 8 calls wants room for a batch of at least 4
    taken = pool.reserve(8, gather=4, gather_seconds=30)
    ender.join()
    # expect: one claim for several places, not one per freed place
    assert taken >= 4
    pool.unreserve(taken)
    for end in ends:
        end.set()
    assert pool.wait_idle(5)


def test_gathering_stops_after_its_time_with_what_is_free():
    pool = CallPool(4)
    release = threading.Event()
    assert pool.reserve(4) == 4
    for _ in range(3):
        pool.run(release.wait)
    pool.unreserve(1)  # one place free, no other will be for a while
    # expect: the one place, once the gathering time is up, not a wait for all four
    assert pool.reserve(4, gather=4, gather_seconds=0.05) == 1
    release.set()
    pool.unreserve(1)
    assert pool.wait_idle(5)
