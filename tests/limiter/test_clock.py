"""The limiter's clock: Redis TIME, read once and followed on this process's monotonic clock."""

from __future__ import annotations

import pytest

from ratejobs.limiter import LimiterConfig
from ratejobs.limiter.core import ClockReading


def test_a_reading_is_followed_on_the_monotonic_clock():
    reading = ClockReading(redis_us=1_700_000_000_250_000, monotonic=100.0)
    assert reading.now(100.0) == pytest.approx(1_700_000_000.25)
    assert reading.now(102.5) == pytest.approx(1_700_000_002.75)


def test_clock_is_redis_time_and_comes_free_with_a_grant(make_limiter, redis_client):
    # given a limiter that has not talked to Redis yet
    limiter = make_limiter(LimiterConfig(rate=100))
    limiter.round_trips = 0
    # expect: its first reading asks Redis; the next ones, and those after a grant, do not
    seconds, micros = redis_client.time()
    first = limiter.clock()
    assert limiter.round_trips == 1
    assert first == pytest.approx(seconds + micros / 1e6, abs=0.5)
    limiter.acquire()
    trips = limiter.round_trips
    later = limiter.clock()
    assert limiter.round_trips == trips
    assert later >= first
