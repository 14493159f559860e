"""Counterexamples the specification test (test_specification.py) found, each cut down to the
few calls that show it, on the run's real Redis."""

from __future__ import annotations

import pytest

from ratejobs.limiter import LimiterConfig, Window


@pytest.mark.xfail(
    strict=True,
    reason="configure.lua rewrites the refund history (convert_history: DEL, ZADD) and never "
    "gives it an expiry, so a bucket whose limits changed keeps :heads forever (T1)",
)
def test_a_limits_change_leaves_the_refund_history_expiring(make_limiter, redis_client):
    # given a bucket with a cost window and one grant that cost something (a refund entry)
    cost_window = Window(rate=100.0, period=1.0, burst=10, unit="cost")
    config = LimiterConfig(rate=5.0, burst=1, windows=(cost_window,), version=1)
    limiter = make_limiter(config)
    limiter.acquire(max_wait=0, cost=1)
    assert redis_client.pttl(limiter.heads_key) > 0
    # when a window is added
    requests_window = Window(rate=2.0, period=1.0, burst=1)
    limiter.configure(
        LimiterConfig(rate=5.0, burst=1, windows=(requests_window, cost_window), version=2)
    )
    # expect the history still to expire (T1: every key a script writes has an expiry)
    assert redis_client.pttl(limiter.heads_key) != -1
