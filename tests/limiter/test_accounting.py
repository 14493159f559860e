"""One account of every unit: a unit is taken from and given back to the same counters once,
and a reset never lets a grant or reservation from before it be mistaken for a later one."""

from __future__ import annotations

import time

import pytest

from ratejobs.limiter import LimiterConfig, Window
from ratejobs.limiter.errors import WaitTooLong
from tests.limiter.conftest import worst_window_excess

# 10 units a second, 20 at once: a 20-unit grant fills it, and a 10-unit reservation after it
# waits 1 s.
TOKENS = Window(10.0, 1.0, 20, "cost")


@pytest.mark.parametrize("then", ["throttle", "limits change"])
def test_a_stale_reservation_gives_back_its_cost_once(make_limiter, then):
    config = LimiterConfig(rate=1000.0, burst=100, windows=(TOKENS,))
    limiter = make_limiter(config)
    # given the window full, a 10-unit reservation 1 s away, and a block that covers its slot
    full = limiter.acquire(cost=20)
    (held,) = limiter.acquire_many(1, costs=[10], max_wait=2)
    assert not held.ready
    block_ends = time.monotonic() + limiter.block(1.5).blocked_for
    # when its holder confirms it: stale, its cost goes back to the schedule it was taken from
    with pytest.raises(WaitTooLong):
        limiter.confirm(held, max_wait=0)
    # and then a 429, or new limits, starts the window again from what was granted
    if then == "throttle":
        limiter.report_throttle(None)
    else:
        limiter.configure(LimiterConfig(rate=999.0, burst=100, windows=(TOKENS,)))
    time.sleep(max(0.0, block_ends - time.monotonic()) + 0.01)
    more = limiter.acquire_many(20, costs=[1] * 20, max_wait=0)
    limiter.release_many([full, *more])
    # expect: the 20 granted are still counted: 10 a second came back since, no more
    slots = [full.slot_us, *(g.slot_us for g in more)]
    costs = [20, *(g.cost for g in more)]
    assert worst_window_excess(slots, costs, rate=10.0, period=1.0, burst=20) <= 0


def test_a_reservation_from_before_a_reset_is_made_again(make_limiter):
    # given 10/s with a burst of 5: 5 granted and 5 reserved over the next half second
    limiter = make_limiter(LimiterConfig(rate=10.0, burst=5))
    before = limiter.acquire_many(10, max_wait=1)
    assert sum(g.ready for g in before) == 5
    # when the limiter is reset, a 429 moves the generation on, and a fresh burst is taken
    limiter.reset()
    limiter.report_throttle(None)
    after = limiter.acquire_many(10, max_wait=1)
    pending = sorted((g for g in (*before, *after) if not g.ready), key=lambda g: g.due)
    sent = [g for g in after if g.ready] + [limiter.confirm(g) for g in pending]
    limiter.release_many(sent)
    # expect: the reservations from before the reset are not granted outside the new schedule
    slots = [g.slot_us for g in sent]
    assert worst_window_excess(slots, [1] * len(slots), rate=10.0, period=1.0, burst=5) <= 0


def test_a_refund_for_a_grant_from_before_a_reset_gives_nothing_back(make_limiter):
    config = LimiterConfig(rate=1000.0, burst=100, windows=(Window(10.0, 1.0, 40, "cost"),))
    limiter = make_limiter(config)
    # given a few grants, then one of 20 whose refund comes after a reset
    for _ in range(3):
        limiter.release(limiter.acquire(cost=1))
    old = limiter.acquire(cost=20)
    limiter.release(old)
    limiter.reset()
    # when the window is filled again and the old grant's refund arrives
    full = limiter.acquire(cost=40)
    limiter.settle(old, 0)
    more = limiter.acquire_many(20, costs=[1] * 20, max_wait=0)
    limiter.release_many([full, *more])
    # expect: it gives back nothing to a window that never counted it
    slots = [full.slot_us, *(g.slot_us for g in more)]
    costs = [40, *(g.cost for g in more)]
    assert worst_window_excess(slots, costs, rate=10.0, period=1.0, burst=40) <= 0
