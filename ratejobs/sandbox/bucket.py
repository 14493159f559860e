"""GCRA token bucket in whole nanoseconds: the sandbox's own limit, exact on arrival."""

from __future__ import annotations

import math

NS_PER_S = 1_000_000_000


class Bucket:
    """`rate` requests per `period` seconds with `burst`, as GCRA on a monotonic ns clock.

    The interval between requests is rounded up to a whole nanosecond, so the bucket is at most
    1 ns per request stricter than the exact rate and never looser: every window [a, b] holds at
    most burst + (b - a) * rate / period admitted requests, with no float rounding to argue about.
    """

    __slots__ = ("burst", "interval_ns", "tat_ns", "tolerance_ns")

    def __init__(self, rate: float, period: float, burst: int) -> None:
        self.tat_ns = 0  # theoretical arrival time of the next request at the steady rate
        self.burst = burst
        self.interval_ns = _interval_ns(rate, period)
        self.tolerance_ns = (burst - 1) * self.interval_ns

    def configure(self, rate: float, period: float, burst: int, *, now_ns: int) -> None:
        """Change the pace. The requests spent so far stay spent, counted in requests: a bucket
        one request in debt at 2/s (500 ms) is one request in debt at 1000/s (1 ms)."""
        interval = _interval_ns(rate, period)
        debt = max(self.tat_ns - now_ns, 0)
        self.tat_ns = now_ns + debt * interval // self.interval_ns
        self.burst = burst
        self.interval_ns = interval
        self.tolerance_ns = (burst - 1) * interval

    def clear(self) -> None:
        self.tat_ns = 0

    def take(self, now_ns: int) -> bool:
        """Admit one request arriving at `now_ns` if the bucket allows it."""
        tat = max(self.tat_ns, now_ns)
        if tat - now_ns > self.tolerance_ns:
            return False
        self.tat_ns = tat + self.interval_ns
        return True

    def charge(self, now_ns: int) -> None:
        """Count a request whether or not it fits (an advertised quota the server does not
        enforce itself still counts down)."""
        self.tat_ns = max(self.tat_ns, now_ns) + self.interval_ns

    def remaining(self, now_ns: int) -> int:
        """Requests that would be admitted right now, one after another."""
        debt = max(self.tat_ns - now_ns, 0)
        if debt > self.tolerance_ns:
            return 0
        return (self.tolerance_ns - debt) // self.interval_ns + 1

    def full_in_ns(self, now_ns: int) -> int:
        """Nanoseconds until the whole burst is available again."""
        return max(self.tat_ns - now_ns, 0)

    def next_in_ns(self, now_ns: int) -> int:
        """Nanoseconds until one request would be admitted."""
        return max(self.tat_ns - now_ns - self.tolerance_ns, 0)


def _interval_ns(rate: float, period: float) -> int:
    return max(1, math.ceil(period * NS_PER_S / rate))
