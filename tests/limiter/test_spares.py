"""One round trip per single grant: a slot near enough is granted at once, and a grant reserves
its caller's next slot (a spare, lib/schedule.lua's reserve_spare), which the next acquire()
only confirms. On the real clock: a spare's due is on this process's clock."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import redis.asyncio

from ratejobs.limiter import AsyncLimiter, LimiterConfig, Window
from ratejobs.limiter.errors import WaitTooLong


def test_a_caller_that_keeps_asking_pays_one_round_trip_per_grant(make_limiter):
    # given 100/s, burst 1: every grant after the first waits 10 ms for its slot
    limiter = make_limiter(LimiterConfig(rate=100, burst=1))
    first = limiter.acquire()
    trips = limiter.round_trips
    # when one caller asks for 30 more, one after another
    grants = [limiter.acquire() for _ in range(30)]
    # expect: one round trip each (no release: without a cap a grant holds no lease), at the
    # pace: consecutive slots at least one interval apart
    assert limiter.round_trips - trips == 30
    slots = [first.slot_us] + [g.slot_us for g in grants]
    assert all(b - a >= 10_000 - 1 for a, b in zip(slots, slots[1:], strict=False))
    assert not any(g.leased for g in grants) and limiter.release(grants[0]) is False
    assert limiter.round_trips - trips == 30


def test_callers_in_several_threads_keep_the_window_bound(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=200, burst=1))
    slots: list[int] = []
    lock = threading.Lock()

    def ask() -> None:
        for _ in range(25):
            grant = limiter.acquire()
            with lock:
                slots.append(grant.slot_us)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    trips = limiter.round_trips
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # expect: 100 grants, 5 ms apart at least, in at most 1.5 round trips each on average
    slots.sort()
    assert len(slots) == 100
    assert all(b - a >= 5_000 - 1 for a, b in zip(slots, slots[1:], strict=False))
    assert (limiter.round_trips - trips) / 100 <= 1.5


def test_a_block_after_the_spare_was_reserved_holds_it_back(make_limiter):
    # given 50/s: a grant, and with it the caller's next slot 20 ms on
    limiter = make_limiter(LimiterConfig(rate=50, burst=1))
    limiter.acquire()
    assert limiter._spares
    # when a 429 elsewhere blocks the API for 0.3 s
    block = make_limiter().block(0.3)
    # expect: the next acquire does not go at the spare's slot but after the block
    grant = limiter.acquire()
    assert grant.slot_us >= block.blocked_until_us
    assert grant.requeued >= 1


@pytest.mark.parametrize(
    "config",
    [
        LimiterConfig(rate=100, burst=1, max_concurrency=4),  # a spare would hold a place
        LimiterConfig(rate=100, burst=1, windows=(Window(1000.0, 3600.0, 1000),)),
        LimiterConfig(rate=10, burst=1),  # 100 ms a slot: a wasted one would cost too much
    ],
    ids=["cap", "window", "slow"],
)
def test_no_spare_where_a_wasted_one_would_cost(make_limiter, config):
    limiter = make_limiter(config)
    limiter.acquire()
    limiter.acquire(max_wait=1)
    assert limiter._spares == []


def test_a_slot_within_the_confirm_ahead_is_granted_in_one_round_trip(make_limiter):
    # given 1,000/s, burst 1: the slot after a grant is 1 ms away
    limiter = make_limiter(LimiterConfig(rate=1000, burst=1))
    first = limiter.acquire()
    trips = limiter.round_trips
    second = limiter.acquire()
    # expect: granted in the one round trip, and left at its slot (the caller slept to it)
    assert limiter.round_trips - trips == 1
    assert second.slot_us - first.slot_us >= 1_000 - 1
    assert limiter._spares == []  # a slot that near is the next ask's in one trip anyway


def test_a_spare_beyond_max_wait_is_kept_for_the_next_ask(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=50, burst=1))
    limiter.acquire()
    trips = limiter.round_trips
    with pytest.raises(WaitTooLong):
        limiter.acquire(max_wait=0.001)
    assert limiter.round_trips == trips  # decided on the spare's own time
    grant = limiter.acquire()
    assert limiter.round_trips - trips == 1 and grant.requeued == 0


def test_a_forked_child_never_confirms_its_parent_spare(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=50, burst=1))
    limiter.acquire()
    assert limiter._spares
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only looks, then leaves without running anything else
        os.write(write, b"1" if limiter._take_spare(1) is None else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert limiter._take_spare(1) is not None  # the parent's is still its own


def test_an_async_caller_that_keeps_asking_pays_one_round_trip_per_grant(make_limiter, redis_url):
    make_limiter(LimiterConfig(rate=100, burst=1))
    name = make_limiter().name

    async def run() -> tuple[int, list[int]]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            limiter = AsyncLimiter(client, name)
            await limiter.acquire()
            trips = limiter.round_trips
            slots = [(await limiter.acquire()).slot_us for _ in range(20)]
            return limiter.round_trips - trips, slots
        finally:
            await client.aclose()

    started = time.monotonic()
    trips, slots = asyncio.run(run())
    assert trips == 20
    assert all(b - a >= 10_000 - 1 for a, b in zip(slots, slots[1:], strict=False))
    assert time.monotonic() - started >= 0.19
