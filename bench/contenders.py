"""The limiters the limiter benchmark compares, each used the way its own docs show.

Every contender is a small gate with `acquire()` (block until one request may go), `release()`
(only ours has something to give back) and `close()`. Libraries are imported inside their
builders so a worker process loads only the one it runs.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis

# limits has no blocking acquire; its README waits with `while not ...: time.sleep(0.01)`.
# Sleeping until get_window_stats().reset_time is the other documented way, but for the fixed
# window that time comes from Redis TTL in whole seconds (0 or 1 for a 1 s window), so it
# either spins or oversleeps by up to half a second; one poll interval for all three
# strategies keeps the rows comparable.
LIMITS_POLL_SECONDS = 0.01
# The key every contender limits: one third-party API.
API_KEY = "api"
# The API wants requests spaced out, one at a time; the contenders that take a burst get this.
API_BURST = 1


class Gate(Protocol):
    """One process's handle on a shared (or, for the local libraries, private) limit."""

    is_async: bool

    def connect(self) -> None:
        """Open Redis connections now, so connection set-up is not timed or counted."""

    def acquire(self) -> Any:
        """Return (or, when is_async, resolve) once one request may be sent."""

    def release(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Contender:
    key: str  # used in Redis key prefixes and --only
    label: str  # first column of the table
    shared: bool  # one limit for all processes (Redis) rather than one per process
    note: str  # how it is used, for the legend
    build: Callable[[str, str, int, bool], Gate]  # (redis url, key prefix, rate, high)
    # parent-side set-up, once a run: (redis url, key prefix, rate, high)
    prepare: Callable[[str, str, int, bool], None] | None = None
    # False for a gate that enforces nothing (the floor): it runs only the unlimited run
    limits: bool = True


class _SyncGate:
    is_async = False
    client: redis.Redis | None = None

    def connect(self) -> None:
        if self.client is not None:
            self.client.ping()

    def release(self) -> None:
        pass

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


# -- ours -----------------------------------------------------------------------------------


def _ours_limiter(client: redis.Redis, prefix: str) -> Any:
    from ratejobs.limiter import Limiter

    return Limiter(client, API_KEY, key_prefix=prefix)


def _prepare_ours(url: str, prefix: str, rate: int, high: bool, burst: int = API_BURST) -> None:
    from ratejobs.limiter import LimiterConfig

    client = redis.Redis.from_url(url)
    try:
        _ours_limiter(client, prefix).configure(
            LimiterConfig(rate=float(rate), period=1.0, burst=burst)
        )
    finally:
        client.close()


def _prepare_ours_batch(url: str, prefix: str, rate: int, high: bool) -> None:
    # At 1,000,000/s and burst 1 a batch's slots lie 1 µs apart, so all but the first would be
    # reserved future slots, each confirmed in a round trip of its own: that measures waiting,
    # which the unlimited run is there to leave out. Burst = the batch lets a whole batch
    # conform at once there (BENCH_BATCH_BURST overrides it, to measure the other case).
    high_burst = int(os.environ.get("BENCH_BATCH_BURST", BATCH_SIZE))
    _prepare_ours(url, prefix, rate, high, high_burst if high else API_BURST)


class OursGate(_SyncGate):
    def __init__(self, url: str, prefix: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.limiter = _ours_limiter(self.client, prefix)
        self.grant: Any = None

    def acquire(self) -> None:
        self.grant = self.limiter.acquire()

    def release(self) -> None:
        # Part of our protocol: the lease backs the optional in-flight cap.
        self.limiter.release(self.grant)


# The engine's batch: a task takes this many call ids and runs them concurrently.
BATCH_SIZE = 32


class OursBatchGate(_SyncGate):
    """acquire_many(BATCH_SIZE) when the last batch is used up, confirm() right before each
    send (it sleeps until the slot and re-checks the block), and release_many() of the whole
    batch before the next one, as a task running its batch of calls does."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.limiter = _ours_limiter(self.client, prefix)
        self.reserved: deque[Any] = deque()
        self.sent: list[Any] = []
        self.grant: Any = None

    def acquire(self) -> None:
        if not self.reserved:
            self._release_sent()
            self.reserved.extend(self.limiter.acquire_many(BATCH_SIZE))
        self.grant = self.limiter.confirm(self.reserved.popleft())

    def release(self) -> None:
        self.sent.append(self.grant)

    def close(self) -> None:
        self._release_sent()
        super().close()

    def _release_sent(self) -> None:
        if self.sent:
            self.limiter.release_many(self.sent)
            self.sent = []


# -- the floor -----------------------------------------------------------------------------


class FloorGate(_SyncGate):
    """Not a limiter: one round trip to a Lua script that returns at once. No limiter that asks
    Redis once per grant can grant faster from these processes, on this machine, than this."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.script = self.client.register_script("return 1")

    def connect(self) -> None:
        super().connect()
        self.script()  # loaded into Redis's script cache before the start, as ours is

    def acquire(self) -> None:
        self.script()


# -- Celery rate_limit --------------------------------------------------------------------


class CeleryGate(_SyncGate):
    """What `rate_limit` does in each worker: a private kombu TokenBucket, capacity 1."""

    def __init__(self, rate: int) -> None:
        from kombu.utils.limits import TokenBucket

        self.bucket = TokenBucket(rate, capacity=1)

    def acquire(self) -> None:
        # The consumer re-schedules a held task after bucket.expected_time(); a sleep here.
        while not self.bucket.can_consume(1):
            time.sleep(self.bucket.expected_time(1))


# -- pyrate-limiter -------------------------------------------------------------------------


class PyrateGate(_SyncGate):
    def __init__(self, client: redis.Redis, bucket: Any) -> None:
        from pyrate_limiter import Limiter

        self.client = client
        self.limiter = Limiter(bucket)

    def acquire(self) -> None:
        # Blocking is the default: it sleeps the bucket's wait plus buffer_ms (50) and retries.
        if not self.limiter.try_acquire(API_KEY):
            raise RuntimeError("pyrate-limiter refused an item it can never admit")

    def close(self) -> None:
        self.limiter.close()
        super().close()


def _build_pyrate_log(url: str, prefix: str, rate: int, high: bool) -> Gate:
    from pyrate_limiter import Duration, Rate, RedisBucket

    client = redis.Redis.from_url(url)
    bucket = RedisBucket.init([Rate(rate, Duration.SECOND)], client, f"{prefix}:bucket")
    return PyrateGate(client, bucket)


def _build_pyrate_gcra(url: str, prefix: str, rate: int, high: bool) -> Gate:
    from pyrate_limiter import GCRA, Duration, Rate, RedisStateStore, StateBucket

    client = redis.Redis.from_url(url)
    # Its timestamps are whole milliseconds, so burst 1 cannot pass more than one request per
    # millisecond; the no-waiting run uses its default burst (= limit) instead.
    burst = None if high else API_BURST
    bucket = StateBucket(
        [Rate(rate, Duration.SECOND, burst=burst)],
        algorithm=GCRA(),
        store=RedisStateStore(client, f"{prefix}:state"),
    )
    return PyrateGate(client, bucket)


# -- limits -------------------------------------------------------------------------------


class LimitsGate(_SyncGate):
    def __init__(self, url: str, prefix: str, rate: int, strategy: str) -> None:
        from limits import RateLimitItemPerSecond
        from limits.storage import RedisStorage
        from limits.strategies import STRATEGIES

        self.storage = RedisStorage(url, key_prefix=prefix)
        self.client = self.storage.get_connection()
        self.strategy = STRATEGIES[strategy](self.storage)
        self.item = RateLimitItemPerSecond(rate, 1)

    def acquire(self) -> None:
        while not self.strategy.hit(self.item, API_KEY):
            time.sleep(LIMITS_POLL_SECONDS)


def _limits(strategy: str) -> Callable[[str, str, int, bool], Gate]:
    def build(url: str, prefix: str, rate: int, high: bool) -> Gate:
        return LimitsGate(url, prefix, rate, strategy)

    return build


# -- aiolimiter -----------------------------------------------------------------------------


class AioGate:
    is_async = True

    def __init__(self, rate: int) -> None:
        from aiolimiter import AsyncLimiter

        self.limiter = AsyncLimiter(rate, 1.0)

    def connect(self) -> None:
        pass

    def acquire(self) -> Any:
        return self.limiter.acquire()

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


CONTENDERS: tuple[Contender, ...] = (
    Contender(
        "ours",
        "ours: ratejobs Limiter (GCRA, burst 1)",
        True,
        "acquire() then release() (both in the counts, acquire alone in the latency); it "
        "reserves a slot, sleeps the exact wait Redis returns, then confirms the slot",
        lambda url, prefix, rate, high: OursGate(url, prefix),
        _prepare_ours,
    ),
    Contender(
        "ours-batch",
        f"ours: ratejobs Limiter, acquire_many (batches of {BATCH_SIZE}, GCRA burst 1)",
        True,
        f"acquire_many({BATCH_SIZE}) for a batch of reserved slots (one round trip), confirm() "
        "right before each grant counts as sent (sleeps until its slot, then one round trip "
        "that re-checks block and rate; none for a slot already due when reserved), "
        "release_many() of the batch before the next; the acquire latency is one grant's share: "
        f"confirm, plus the batch call for the first of each batch; burst {BATCH_SIZE} in the "
        "unlimited run, so a whole batch conforms at once (at burst 1 and 1,000,000/s its slots "
        "lie 1 µs apart and each would be confirmed)",
        lambda url, prefix, rate, high: OursBatchGate(url, prefix),
        _prepare_ours_batch,
    ),
    Contender(
        "celery",
        "Celery rate_limit (kombu TokenBucket per worker)",
        False,
        "TokenBucket(rate, capacity=1) per process, sleeping expected_time() as the consumer "
        "does; no Redis: each of the N workers enforces the full rate on its own",
        lambda url, prefix, rate, high: CeleryGate(rate),
    ),
    Contender(
        "pyrate-log",
        "pyrate-limiter 4 RedisBucket (sliding-window log)",
        True,
        "Limiter(RedisBucket.init(...)).try_acquire(), blocking (its default) with the default "
        "buffer_ms=50; item times come from each worker's clock, in ms",
        _build_pyrate_log,
    ),
    Contender(
        "pyrate-gcra",
        "pyrate-limiter 4 StateBucket + RedisStateStore (GCRA, burst 1)",
        True,
        "the README's GCRA recipe on Redis, blocking try_acquire() with buffer_ms=50 after each "
        "refusal; burst 1 in the limited run, its default burst (= limit) in the unlimited one, "
        "since its whole-millisecond timestamps let burst 1 pass only 1 grant per ms",
        _build_pyrate_gcra,
    ),
    Contender(
        "limits-moving",
        "limits RedisStorage, moving window",
        True,
        f"no blocking acquire: `while not hit(): sleep({LIMITS_POLL_SECONDS})` as in its README",
        _limits("moving-window"),
    ),
    Contender(
        "limits-fixed",
        "limits RedisStorage, fixed window",
        True,
        "same poll loop; a window starts at its first hit and lasts 1 s",
        _limits("fixed-window"),
    ),
    Contender(
        "limits-sliding",
        "limits RedisStorage, sliding window counter",
        True,
        "same poll loop; weights the previous window's count by its remaining share",
        _limits("sliding-window-counter"),
    ),
    Contender(
        "aiolimiter",
        "aiolimiter AsyncLimiter per process",
        False,
        "AsyncLimiter(rate, 1) in each process, `await acquire()`; leaky bucket whose capacity is "
        "the whole rate, so each process may burst `rate` at once",
        lambda url, prefix, rate, high: AioGate(rate),
    ),
    Contender(
        "floor",
        "floor: one round trip to a script that returns at once (no limit)",
        True,
        "EVALSHA of `return 1` per acquire, on the same client as the others: what any limiter "
        "that asks Redis once per grant can at most reach from these processes on this "
        "machine; it limits nothing, so it has no limited run",
        lambda url, prefix, rate, high: FloorGate(url),
        limits=False,
    ),
)
