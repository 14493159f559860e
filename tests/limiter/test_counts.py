"""Running counts for metrics: every worker adds to one total in Redis, inside the scripts."""

from __future__ import annotations

import time

import pytest

from ratejobs.limiter import Limiter, LimiterConfig, LimiterCounts, WaitTooLong


def test_counts_add_up_grants_waits_refusals_blocks_and_throttles(make_limiter, redis_client):
    # given two processes' limiters on one API: 20/s, burst 1, at most 1 in flight, adaptive
    first = make_limiter(LimiterConfig(rate=20, burst=1, max_concurrency=1, adaptive=True))
    second = Limiter(redis_client, first.name)
    assert first.state().counts == LimiterCounts()

    held = first.acquire()  # granted at once
    time.sleep(0.06)  # the next slot is free by now...
    with pytest.raises(WaitTooLong):
        second.acquire(max_wait=0.01)  # ...but the cap of 1 is taken
    first.release(held)
    with second.slot():  # a grant at once
        pass
    with pytest.raises(WaitTooLong):
        first.acquire(max_wait=0.001)  # ~50 ms away again, more than accepted
    first.report_throttle(held, block_seconds=0.2)  # first 429 of its burst: a rate cut
    first.report_throttle(held)  # the same burst: counted, but no second cut
    second.block(0.1)

    with first.slot():  # ~50 ms after the last grant: a wait, then a grant
        pass

    counts = second.state().counts
    assert (counts.grants, counts.waits, counts.too_long) == (3, 1, 1)
    assert (counts.throttles, counts.blocks, counts.decreases) == (2, 2, 1)
    assert counts.at_capacity >= 1  # once per look while waiting for the lease
    assert counts.wait_seconds > 0

    first.reset()
    assert first.state().counts == LimiterCounts()
