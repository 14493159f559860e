"""A window is known by what it limits (its period and unit), not by its place in the limits:
a change keeps each remaining window's use, whatever was added, dropped or moved around it."""

from __future__ import annotations

import time

import pytest

from ratejobs.limiter import LimiterConfig, Window
from tests.limiter.conftest import worst_window_excess

# 30 per 3 s with a burst of 30 (the 30 a day, made short), and a window far faster
# that never binds; the main rate (100/s, burst 100) does not bind either.
SLOW = Window(30.0, 3.0, 30)
FAST = Window(1000.0, 1.0, 1000)
# Long enough for FAST (1000/s) to have refilled from 30 grants, so its use differs from
# SLOW's when the change is made.
SETTLE_SECONDS = 0.1


def _limits(*windows: Window) -> LimiterConfig:
    return LimiterConfig(rate=100.0, burst=100, windows=windows)


@pytest.mark.parametrize(
    "before, after",
    [
        ((FAST, SLOW), (SLOW,)),  # the fast window dropped
        ((SLOW,), (FAST, SLOW)),  # a window added in front
        ((FAST, SLOW), (SLOW, FAST)),  # reordered
        ((SLOW,), (Window(20.0, 3.0, 30),)),  # resized: the same period and unit
    ],
    ids=["drop", "add-in-front", "reorder", "resize"],
)
def test_a_limits_change_never_hands_back_a_spent_window(make_limiter, before, after):
    # given the slow window's 30 spent
    limiter = make_limiter(_limits(*before))
    spent = limiter.acquire_many(30, max_wait=0)
    assert len(spent) == 30 and all(g.ready for g in spent)
    limiter.release_many(spent)
    time.sleep(SETTLE_SECONDS)
    # when a manager changes the other windows around it
    assert limiter.configure(_limits(*after))
    more = limiter.acquire_many(30, max_wait=0.2)
    limiter.release_many(more)
    # expect: no more than its rate brought back since; 30 per 3 s held across the change
    slots = [g.slot_us for g in (*spent, *more)]
    assert worst_window_excess(slots, [1] * len(slots), rate=30.0, period=3.0, burst=30) <= 0
    assert len(more) <= 3


def test_a_kept_window_keeps_its_use_in_units_at_its_new_rate(make_limiter):
    limiter = make_limiter(_limits(FAST, SLOW))
    limiter.release_many(limiter.acquire_many(12, max_wait=0))
    # the slow window moves in front and halves its rate: 12 used stay 12 used
    limiter.configure(_limits(Window(15.0, 3.0, 30), FAST))
    slow, fast = limiter.state().windows
    assert slow.window == Window(15.0, 3.0, 30)
    # (less what refilled in the few ms since the grants: half a unit is 50 ms)
    assert 18 <= slow.remaining < 18.5
    assert slow.full_in == pytest.approx(12 * 0.2, abs=0.1)
    assert fast.window == FAST and fast.remaining >= 988


def test_a_new_window_counts_what_a_slower_window_remembers_else_starts_spent(make_limiter):
    # given 30 taken under the slow window alone
    limiter = make_limiter(_limits(SLOW))
    limiter.release_many(limiter.acquire_many(30, max_wait=0))
    # when a faster window is added, the slow one bounds what it could hold: its 30
    limiter.configure(_limits(SLOW, FAST))
    assert limiter.state().windows[1].remaining == pytest.approx(970, abs=1)
    # and when the slow window is dropped and added again, nothing slower remembers its
    # period (the main rate and FAST are faster): it starts spent, refilling at its rate
    limiter.configure(_limits(FAST))
    limiter.configure(_limits(FAST, SLOW))
    fast, slow = limiter.state().windows
    assert slow.remaining < 0.1
    assert slow.full_in == pytest.approx(3.0, rel=0.02)
