"""The GCRA bucket and the statistics computed from the arrival log, without HTTP."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.bucket import NS_PER_S, Bucket
from sandbox.state import Arrival, count_retry_after_violations, worst_count_in_window

MS = 1_000_000


def test_bucket_admits_the_burst_at_once_then_one_per_interval():
    bucket = Bucket(rate=10, period=1, burst=3)
    start = 1_000 * NS_PER_S
    assert [bucket.take(start) for _ in range(4)] == [True, True, True, False]
    assert bucket.remaining(start) == 0
    assert bucket.next_in_ns(start) == 100 * MS
    assert not bucket.take(start + 100 * MS - 1)
    assert bucket.take(start + 100 * MS)
    # after 3 intervals of silence the whole burst is back
    assert bucket.full_in_ns(start + 100 * MS) == 300 * MS
    assert bucket.remaining(start + 400 * MS) == 3


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 1000),
    period=st.integers(1, 5),
    burst=st.integers(1, 10),
    gaps=st.lists(st.integers(0, 50 * MS), min_size=1, max_size=60),
)
def test_bucket_keeps_every_window_within_burst_plus_rate(rate, period, burst, gaps):
    # given arrivals at arbitrary times, admitted or not on arrival
    bucket = Bucket(rate, period, burst)
    now, admitted = 10 * NS_PER_S, []
    for gap in gaps:
        now += gap
        if bucket.take(now):
            admitted.append(now)
    # expect: every window [a_i, a_j] holds at most burst + width * rate / period, exactly
    for i in range(len(admitted)):
        for j in range(i, len(admitted)):
            width = Fraction(admitted[j] - admitted[i], NS_PER_S)
            assert j - i + 1 <= burst + width * rate / period


@given(
    times=st.lists(st.integers(0, 5_000), max_size=40).map(sorted),
    window=st.integers(1, 2_000),
)
def test_worst_count_in_window_matches_brute_force(times, window):
    expected = max(
        (sum(1 for t in times if start <= t < start + window) for start in times), default=0
    )
    assert worst_count_in_window(times, window) == expected


def arrival(t_ns: int, sent_ns: int | None = None, until_ns: int | None = None) -> Arrival:
    entry = Arrival(0, t_ns, "/", 429 if sent_ns is not None else 200, None)
    entry.sent_ns, entry.retry_until_ns = sent_ns, until_ns
    return entry


def test_violations_count_arrivals_between_a_429_being_sent_and_its_retry_after():
    log = [
        arrival(0, sent_ns=10, until_ns=100),  # a 429, told to wait until 100
        arrival(5),  # before the 429 went out: the client could not have known
        arrival(50),  # violation
        arrival(99),  # violation
        arrival(100),  # on time
        arrival(150, sent_ns=160, until_ns=None),  # a 429 without Retry-After asks nothing
        arrival(170),
    ]
    assert count_retry_after_violations(log) == 2


def test_overlapping_retry_afters_count_each_arrival_once():
    log = [
        arrival(0, sent_ns=1, until_ns=100),
        arrival(10, sent_ns=11, until_ns=50),  # itself a violation of the first
        arrival(60),  # inside the first only
        arrival(120),
    ]
    assert count_retry_after_violations(log) == 2


def test_bucket_keeps_its_debt_in_requests_when_the_rate_changes():
    # given 2/s burst 1 with one request spent: 500 ms until the next
    bucket = Bucket(rate=2, period=1, burst=1)
    start = 1_000 * NS_PER_S
    assert bucket.take(start)
    assert bucket.next_in_ns(start) == 500 * MS
    # when the rate becomes 1000/s, the one request spent costs 1 ms
    bucket.configure(rate=1000, period=1, burst=1, now_ns=start)
    assert bucket.next_in_ns(start) == 1 * MS
    assert bucket.take(start + 1 * MS)
