"""GCRA token buckets in whole nanoseconds, and the set of them a request must fit: the
sandbox's own limits, exact on arrival."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.config import SandboxConfig

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

    def take(self, now_ns: int, cost: int = 1) -> bool:
        """Admit a request of `cost` units (1: one request) arriving at `now_ns` if the bucket
        allows it."""
        if self.wait_ns(now_ns, cost) != 0:
            return False
        self.charge(now_ns, cost)
        return True

    def charge(self, now_ns: int, cost: int = 1) -> None:
        """Count a request whether or not it fits (an advertised quota the server does not
        enforce itself still counts down)."""
        self.tat_ns = max(self.tat_ns, now_ns) + cost * self.interval_ns

    def wait_ns(self, now_ns: int, cost: int = 1) -> int | None:
        """Nanoseconds until `cost` units fit (0: now); None when they never can, being more
        than the burst. GCRA for a cost: the bucket must hold the whole cost at once, so every
        window [a, b] still holds at most burst + (b - a) * rate / period units."""
        if cost <= 0:
            return 0
        if cost > self.burst:
            return None
        return max(self.tat_ns - now_ns - (self.burst - cost) * self.interval_ns, 0)

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


MAIN = "main"
TOKENS = "tokens"


def window_name(index: int) -> str:
    return f"window:{index}"


# Not frozen: built for every request under the state's lock, where a frozen init costs double.
@dataclass(slots=True)
class Quota:
    """One bucket as the quota headers advertise it, after a request."""

    name: str  # "main", "window:<i>" or "tokens"
    limit: float  # units per period it advertises
    period: float
    burst: int
    remaining: int  # units that would be admitted right now
    reset_after: float  # seconds until the whole burst is back


@dataclass(slots=True)
class Decision:
    """Whether a request fits every bucket, and what each bucket advertises afterwards."""

    admitted: bool
    cause: str | None  # the bucket that refused (the longest wait): "main", "window:<i>", "tokens"
    wait: float | None  # refused: seconds until the request fits every bucket; None: never
    requests: tuple[Quota, ...]  # the advertised main bucket, then each window
    tokens: Quota | None  # the token budget, when there is one

    @property
    def tightest(self) -> Quota:
        """The request quota closest to refusing: fewest left, then the longest to refill (as
        ratejobs.limiter.headers.parse_quota ranks quotas)."""
        return min(self.requests, key=lambda quota: (quota.remaining, -quota.reset_after))


class Limits:
    """Every bucket a request must fit: the main one (enforced at `real_rate`, advertised at
    `rate`), each extra window and the token budget. A request is admitted only when all of them
    can take it; then it is taken from all, and a refused request is charged to none."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.enforced = Bucket(config.enforced_rate, config.period, config.burst)
        self.advertised = Bucket(config.rate, config.period, config.burst)
        self.windows = [Bucket(*window) for window in config.windows]
        self.tokens = _token_bucket(config)

    def clear(self) -> None:
        for bucket in self._all():
            bucket.clear()

    def configure(self, config: SandboxConfig, *, now_ns: int) -> None:
        """Take a new config; units spent stay spent, counted in units, in each bucket that
        stays (window i stays window i; a new window or budget starts full)."""
        self.config = config
        self.enforced.configure(config.enforced_rate, config.period, config.burst, now_ns=now_ns)
        self.advertised.configure(config.rate, config.period, config.burst, now_ns=now_ns)
        windows = []
        for i, window in enumerate(config.windows):
            if i < len(self.windows):
                self.windows[i].configure(*window, now_ns=now_ns)
                windows.append(self.windows[i])
            else:
                windows.append(Bucket(*window))
        self.windows = windows
        if config.token_rate is None or config.token_period is None:
            self.tokens = None
        elif self.tokens is None:
            self.tokens = _token_bucket(config)
        else:
            self.tokens.configure(
                config.token_rate, config.token_period, config.effective_token_burst, now_ns=now_ns
            )

    def decide(self, now_ns: int, tokens: int = 1) -> Decision:
        """Admit one request of `tokens` tokens arriving at `now_ns`, or refuse it."""
        config = self.config
        enforced: list[tuple[str, Bucket, int]] = [(MAIN, self.enforced, 1)]
        enforced += [(window_name(i), bucket, 1) for i, bucket in enumerate(self.windows)]
        if self.tokens is not None:
            enforced.append((TOKENS, self.tokens, tokens))
        # The request fits every bucket once it fits the slowest: its wait is the Retry-After.
        cause: str | None = None
        longest: int | None = 0
        if not config.no_limit:
            for name, bucket, cost in enforced:
                wait = bucket.wait_ns(now_ns, cost)
                if wait is None or (longest is not None and wait > longest):
                    cause, longest = name, wait
        admitted = cause is None
        if admitted:
            # With no_limit the enforced buckets are left alone, as before windows existed: a
            # debt run up meanwhile would throttle for minutes once the limit is back on. The
            # advertised main quota still counts down.
            if not config.no_limit:
                for _, bucket, cost in enforced:
                    bucket.charge(now_ns, cost)
            self.advertised.charge(now_ns)
        requests = [_quota(MAIN, config.rate, config.period, self.advertised, now_ns)]
        requests += [
            _quota(window_name(i), rate, period, bucket, now_ns)
            for i, ((rate, period, _), bucket) in enumerate(
                zip(config.windows, self.windows, strict=True)
            )
        ]
        token_quota = None
        if self.tokens is not None and config.token_rate is not None:
            token_quota = _quota(
                TOKENS, config.token_rate, config.token_period or 0.0, self.tokens, now_ns
            )
        return Decision(
            admitted=admitted,
            cause=cause,
            wait=None if admitted or longest is None else longest / NS_PER_S,
            requests=tuple(requests),
            tokens=token_quota,
        )

    def _all(self) -> list[Bucket]:
        tokens = [] if self.tokens is None else [self.tokens]
        return [self.enforced, self.advertised, *self.windows, *tokens]


def _token_bucket(config: SandboxConfig) -> Bucket | None:
    if config.token_rate is None or config.token_period is None:
        return None
    return Bucket(config.token_rate, config.token_period, config.effective_token_burst)


def _quota(name: str, limit: float, period: float, bucket: Bucket, now_ns: int) -> Quota:
    return Quota(
        name=name,
        limit=limit,
        period=period,
        burst=bucket.burst,
        remaining=bucket.remaining(now_ns),
        reset_after=bucket.full_in_ns(now_ns) / NS_PER_S,
    )
