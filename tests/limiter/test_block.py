"""Instant global back-off: after block(), no caller anywhere is granted until it ends."""

from __future__ import annotations

import threading
import time

import pytest

from ratejobs.limiter import LimiterConfig
from tests.limiter.workers import take_batches_until, take_grants_until

PROCESSES = 8
# A holder may confirm its slot up to 5 ms early (docs/limiter.md, R1) and then leaves at the
# slot: confirmed just before a block came, it leaves up to 5 ms into the block, as a request
# already on the wire would. Only a grant made after the block is one it must have stopped.
CONFIRM_AHEAD_US = 5_000


def test_block_stops_a_caller_already_holding_a_future_slot(make_limiter, redis_client):
    # given 2/s: the first grant is immediate, the second caller holds a slot 500 ms away
    limiter = make_limiter(LimiterConfig(rate=2, burst=1))
    first = limiter.acquire()
    holder: dict = {}
    waiter = threading.Thread(target=lambda: holder.update(grant=limiter.acquire()))
    waiter.start()
    time.sleep(0.1)
    assert limiter.state().next_free_us > first.slot_us + 500_000 - 1  # the slot is reserved
    # when a 429 elsewhere blocks the limiter for 1.5 s
    block = limiter.block(1.5)
    waiter.join(10)
    # expect: the holder was not granted at its old slot but only after the block
    assert holder["grant"].granted_us >= block.blocked_until_us
    assert holder["grant"].slot_us >= block.blocked_until_us


@pytest.mark.parametrize(
    "taker",
    [take_grants_until, take_batches_until],
    ids=["one at a time", "acquire_many batches of 8"],
)
def test_block_stops_every_process_until_it_ends(make_limiter, redis_url, spawn, taker):
    # given 8 processes pacing at 50/s, so most of them hold a reserved future slot (with
    # batches, up to 8 each)
    limiter = make_limiter(LimiterConfig(rate=50, burst=2))
    barrier, results = spawn.Barrier(PROCESSES + 1), spawn.Queue()
    procs = [
        spawn.Process(
            target=taker,
            args=(redis_url, limiter.name, 2.5, barrier, results),
            kwargs={"config": limiter.config},
        )
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    time.sleep(0.7)
    # when one worker records a 429 with Retry-After: 1
    block = limiter.block(1.0)
    reports = [results.get(timeout=60) for _ in range(PROCESSES)]
    for p in procs:
        p.join(10)
    granted = [g for _, grants, _ in reports for g in grants]
    inside = [
        g for g in granted if block.now_us + CONFIRM_AHEAD_US <= g[1] < block.blocked_until_us
    ]
    ahead = [g for g in granted if block.now_us <= g[1] < block.now_us + CONFIRM_AHEAD_US]
    before = [g for g in granted if g[1] < block.now_us]
    after = [g for g in granted if g[1] >= block.blocked_until_us]
    print(
        f"grants before/confirmed ahead/inside/after the block: "
        f"{len(before)}/{len(ahead)}/{len(inside)}/{len(after)}"
    )
    # expect: zero grants inside the block, and work going on both before and after it
    assert inside == [], [(slot - block.now_us, granted - block.now_us) for slot, granted in inside]
    assert before and after


def test_block_never_shortens_a_longer_block(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=10))
    long = limiter.block(5)
    short = limiter.block(1)
    assert short.blocked_until_us == long.blocked_until_us
    assert limiter.state().blocked_for > 4
