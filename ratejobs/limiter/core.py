"""What the sync and asyncio limiters share: keys, results, and each operation as a sans-I/O
generator of steps (run a script, sleep, wait for a freed lease) that a front end performs."""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from ratejobs.limiter.config import MAX_COST, LimiterConfig, Window
from ratejobs.limiter.deployment import deployment_key_prefix
from ratejobs.limiter.errors import (
    LimiterError,
    LimiterNotConfigured,
    LimiterUnavailable,
    TooBig,
    WaitTooLong,
)
from ratejobs.limiter.headers import is_throttle, throttle_delay

MICROS = 1_000_000
# A lease covers waiting for the slot plus the request itself; after this long a worker that
# died holding it no longer counts as in flight.
DEFAULT_LEASE_SECONDS = 120.0
# Sleepers wake at least this often to re-confirm, so a raised rate or a cleared block reaches
# callers that reserved a distant slot under the old limits.
MAX_SLEEP_SECONDS = 1.0
# A holder confirms its reservation this long before its slot, and acquire.lua grants it up to
# 5 ms early (lib/schedule.lua's CONFIRM_AHEAD_US), so the request leaves at its slot and not a
# round trip later: a sleep overshoots by a fraction of a millisecond, a round trip takes about one.
CONFIRM_AHEAD_SECONDS = 0.0045
# A grant goes stale a whole slot after its slot (Grant.stale_at), but never sooner than this
# after it: the round trip and the client's own work before the request is written take a
# millisecond or two, so at thousands of slots a second every grant would read as stale. What it
# is for is longer: an event loop that held the grant while it ran other callbacks, a
# connection opened (DNS, TCP, TLS) after the grant, tens of milliseconds and more.
STALE_GRANT_MIN_SECONDS = 0.01
# Callers waiting for in-flight capacity are woken by releases; this bounds the wait when a
# lease expires instead (a killed worker) and must stay below the client's socket timeout.
MAX_CAPACITY_WAIT_SECONDS = 0.5
# 429s that carry no Retry-After still stop everyone briefly, so the other workers do not pile
# more requests onto an API that is already refusing them.
DEFAULT_THROTTLE_BLOCK_SECONDS = 1.0
# acquire_many's largest batch: acquire_many.lua returns every slot in one reply and runs while
# all of Redis waits, so a batch stays far below Lua's unpack limit (~8,000) and takes well under
# a millisecond; a worker runs tens of calls at once, not thousands.
MAX_BATCH = 1000
# The rate history (Limiter.rate_history, the operator's chart of the adaptive rate): grants
# sample it at most this often, so a grant between samples costs one more field read and
# nothing else...
RATE_SAMPLE_SECONDS = 2.0
# ... and it keeps this many samples: 6 h at one per 2 s (1.5 MB per limiter in Redis,
# measured with MEMORY USAGE).
RATE_SAMPLES_KEPT = 10_800
# Redis's clock, once read, is followed on this process's monotonic clock for this long before
# it is read again: the two drift apart by NTP's slew at most (500 ppm, 30 ms a minute), far
# less than the whole seconds of a reset header. A grant's reply carries a reading for free.
CLOCK_READING_MAX_AGE = 60.0
# The code acquire.lua's error reply starts with for a request larger than a burst (too_big).
TOO_BIG_CODE = "TOOBIG "
# The keys of a limiter that hold live state, which a reset forgets; its config stays.
LIVE_KEY_PARTS = ("state", "leases", "released", "heads", "rates")

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,201}$")

GRANTED, WAIT, TOO_LONG, AT_CAPACITY, NOT_CONFIGURED = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Grant:
    """Permission to send one request now. Release it when the request has finished.

    acquire_many also hands out grants for slots still in the future (ready False): pass such a
    grant to confirm() right before sending; it sleeps until the slot and checks the block and
    the rate again.
    """

    lease_id: str
    weight: int
    slot_us: int  # the slot granted, on Redis's clock
    granted_us: int  # Redis's clock when it was granted or reserved (>= slot_us when ready)
    generation: int  # report a throttle with it, so one burst of 429s counts once
    waited: float  # seconds the caller spent waiting for it
    requeued: int = 0  # reservations made again (a block, a rate cut, a holder a slot late)
    ready: bool = True  # False: a reserved future slot that confirm() must turn into a grant
    due: float = 0.0  # time.monotonic() at which a reserved slot comes (reply time + its wait)
    lease_seconds: float = DEFAULT_LEASE_SECONDS  # what confirm() renews the lease with
    cost: int = 0  # units taken from each "cost" window (tokens); settle() corrects it
    cost_seq: int = -1  # its reservation's number in the cost windows' history (settle.lua)
    # False: it holds no lease (the limiter has no in-flight cap), release() has nothing to do
    leased: bool = True
    # time.monotonic() from which a request sent on it would leave a whole slot late. Redis
    # queues a holder that late again (acquire.lua), but a grant can also wait in the caller's
    # hands after Redis made it (a busy event loop, a connection opened after the grant); sent
    # then, it lands beside the next on-time requests, and several held up together reach the
    # API together. The adapters take a new slot instead. Counted from before the grant was
    # asked for: early by the round trip, never late however long its reply waited to be read.
    # inf: not checked (a ready grant of acquire_many).
    stale_at: float = math.inf

    @property
    def stale(self) -> bool:
        return time.monotonic() >= self.stale_at


@dataclass(frozen=True)
class GrantBatch:
    """What acquire_many got: up to `requested` grants in slot order, some perhaps still to be
    confirmed (Grant.ready). Fewer than requested when max_wait or the in-flight cap stopped
    it; then retry_after says how long until asking again could get more."""

    grants: tuple[Grant, ...]
    requested: int
    retry_after: float  # seconds; 0 when every requested slot was reserved
    now_us: int  # Redis's clock when the slots were reserved
    # it stopped early at the in-flight cap (a release makes room), not at max_wait
    at_capacity: bool = False

    def __len__(self) -> int:
        return len(self.grants)

    def __iter__(self) -> Iterator[Grant]:
        return iter(self.grants)


@dataclass(frozen=True)
class Feedback:
    """What a block or throttle report did."""

    accepted: bool  # this throttle was the first of its burst and started a new generation
    generation: int
    blocked_until_us: int
    now_us: int
    rate_before: float
    rate_after: float

    @property
    def rate_decreased(self) -> bool:
        return self.rate_after < self.rate_before

    @property
    def blocked_for(self) -> float:
        return max(0.0, (self.blocked_until_us - self.now_us) / MICROS)


@dataclass(frozen=True)
class LimiterCounts:
    """Running totals since the limiter's state was created or last reset, summed over every
    worker; the metrics export them as counters."""

    grants: int = 0
    waits: int = 0  # reservations of a later slot (the caller slept, or was told to)
    wait_us: int = 0  # total of those waits
    too_long: int = 0  # answers "the next slot is further away than you accept"
    at_capacity: int = 0  # answers "max_concurrency requests are already in flight"
    throttles: int = 0  # 429s reported (every one, not only the first of a burst)
    blocks: int = 0  # Retry-After or spent-quota blocks, and manual blocks
    decreases: int = 0  # adaptive rate cuts

    @property
    def wait_seconds(self) -> float:
        return self.wait_us / MICROS


@dataclass(frozen=True)
class WindowState:
    """One window of the limits now. Reserved slots count as taken."""

    window: Window
    remaining: float  # units that could be taken now, one request after another
    next_free_in: float  # seconds until one more unit can be taken (0: now)
    full_in: float  # seconds until the whole burst is back (the window has refilled)


@dataclass(frozen=True)
class RateSample:
    """The limiter as it stood at one moment of its recent history (sampled as grants are made,
    at most one sample per RATE_SAMPLE_SECONDS): what the adaptive rate was, and how many
    grants had been made so far, so the difference of two samples is the grants between them."""

    at: float  # unix time, seconds
    rate: float  # requests per period the limiter was granting at (current_rate then)
    period: float
    grants: int  # the state's cumulative grant counter at that moment

    @property
    def rate_per_second(self) -> float:
        return self.rate / self.period


@dataclass(frozen=True)
class LimiterState:
    name: str
    configured: bool
    now_us: int
    rate: float  # configured ceiling, requests per period
    period: float
    burst: int
    max_concurrency: int
    adaptive: bool
    min_rate: float
    current_rate: float  # requests per period now (below rate after adaptive cuts)
    next_free_us: int
    blocked_until_us: int
    in_flight: int
    generation: int
    counts: LimiterCounts = LimiterCounts()
    config_version: int = 0  # LimiterConfig.version of the stored limits
    windows: tuple[WindowState, ...] = ()  # the config's windows besides the main rate
    # The API's real limit as the adaptive rate learned it from throttles (requests per period);
    # None until one was measured, or without learning.
    learned_rate: float | None = None

    @property
    def blocked_for(self) -> float:
        return max(0.0, (self.blocked_until_us - self.now_us) / MICROS)

    @property
    def next_free_in(self) -> float:
        return max(0.0, (self.next_free_us - self.now_us) / MICROS)


@dataclass(frozen=True)
class ClockReading:
    """Redis's clock as a reply carried it, and this process's time.monotonic() when the reply
    arrived: the time on Redis's clock later, without asking Redis again."""

    redis_us: int
    monotonic: float

    def now(self, monotonic: float) -> float:
        """Unix seconds on Redis's clock at `monotonic` (this process's time.monotonic()).

        The reply left Redis a little before it arrived, so this reads a little early: a block
        measured against it is a little longer, never shorter."""
        return self.redis_us / MICROS + (monotonic - self.monotonic)


@dataclass(frozen=True)
class RunScript:
    name: str
    keys: list[str]
    args: list[Any]


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class AwaitRelease:
    key: str
    seconds: float


@dataclass(frozen=True)
class Delete:
    keys: list[str]


@dataclass(frozen=True)
class ReadRange:
    """A sorted set's members scored from `low` to `high` (ZRANGEBYSCORE), lowest first."""

    key: str
    low: int | str
    high: int | str


Step = RunScript | Sleep | AwaitRelease | Delete | ReadRange
Steps = Generator[Step, Any, Any]


class _TranslatedRedisErrors:
    """Fail closed: any Redis failure becomes an error, never a grant. A Redis at its
    maxmemory refuses every script as an unreachable one refuses connections: nothing was
    decided, so the caller waits as it would for a Redis that is down.

    A class rather than a @contextmanager generator: it wraps every round trip, and a
    generator's set-up cost a single acquire about 1 µs."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is None or not isinstance(exc, redis.RedisError):
            return
        name = self.name
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            raise LimiterUnavailable(f"limiter {name!r}: Redis is out of memory: {exc}") from exc
        if isinstance(exc, redis.ResponseError):
            if str(exc).startswith(TOO_BIG_CODE):
                raise TooBig(f"limiter {name!r}: {str(exc)[len(TOO_BIG_CODE) :]}") from exc
            raise LimiterError(f"limiter {name!r}: {exc}") from exc
        raise LimiterUnavailable(f"limiter {name!r}: Redis unreachable: {exc}") from exc


def translate_redis_errors(name: str) -> _TranslatedRedisErrors:
    return _TranslatedRedisErrors(name)


def new_lease_id() -> str:
    """128 random bits as 32 hex digits, as uuid4().hex was, at a fifth of its cost."""
    return os.urandom(16).hex()


def _wait_left_us(max_wait: float | None, started: float) -> int:
    """What is left of max_wait seconds since `started` (monotonic), in µs; -1 for no limit."""
    if max_wait is None:
        return -1
    return max(0, int((max_wait - (time.monotonic() - started)) * MICROS))


class LimiterBase:
    """Keys and operations; subclasses perform the steps synchronously or with asyncio."""

    def __init__(
        self,
        client: Any,
        name: str,
        config: LimiterConfig | None = None,
        *,
        key_prefix: str | None = None,
        rate_samples_kept: int = RATE_SAMPLES_KEPT,
        spare_slots: bool = True,
    ) -> None:
        if not _NAME.match(name):
            raise ValueError("limiter name must be 1-201 of A-Z a-z 0-9 _ . : -")
        self.client = client
        self.name = name
        self.config = config
        self.round_trips = 0
        self._clock_reading: ClockReading | None = None
        # The next slots acquire.lua reserved for this process's callers with their grants
        # (lib/schedule.lua's reserve_spare); a forked child must not confirm its parent's.
        self.spare_slots = spare_slots
        self._spares: list[Grant] = []
        self._spares_pid = os.getpid()
        self._spares_lock = threading.Lock()
        # One hash tag for all keys of a limiter: its scripts touch several keys at once, which
        # Redis Cluster allows only within one slot.
        if key_prefix is None:  # the deployment's, as its environment names it
            key_prefix = deployment_key_prefix()
        base = self._base = f"{key_prefix}:{{{name}}}"
        self.config_key = f"{base}:config"
        self.state_key = f"{base}:state"
        self.leases_key = f"{base}:leases"
        self.released_key = f"{base}:released"
        self.heads_key = f"{base}:heads"
        self.rates_key = f"{base}:rates"
        self.keys = [
            self.config_key,
            self.state_key,
            self.leases_key,
            self.released_key,
            self.heads_key,
            self.rates_key,
        ]
        # The rate history's arguments to the scripts that sample it: spacing (µs) and cap.
        self._history_args = [int(RATE_SAMPLE_SECONDS * MICROS), rate_samples_kept]
        from ratejobs.limiter.scripts import SOURCES

        self._scripts = {name: client.register_script(src) for name, src in SOURCES.items()}

    # -- operations as steps --------------------------------------------------------------

    def _configure_steps(self, config: LimiterConfig) -> Steps:
        reply = yield RunScript(
            "configure",
            [self.config_key, self.state_key, self.heads_key],
            config.as_script_args(),
        )
        self.config = config
        return bool(int(reply[0]))

    def _configure_from_own(self) -> Steps:
        if self.config is None:
            raise LimiterNotConfigured(
                f"limiter {self.name!r} has no configuration in Redis and none was given"
            )
        yield from self._configure_steps(self.config)

    def _config_version(self) -> int:
        return 0 if self.config is None else self.config.version

    def _check_weight(self, weight: int) -> None:
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
            raise ValueError("weight must be a whole number >= 1")
        if self.config is not None and weight > self.config.burst:
            raise TooBig(f"weight {weight} exceeds burst {self.config.burst}")

    def _check_cost(self, cost: int) -> None:
        if not isinstance(cost, int) or isinstance(cost, bool) or not 0 <= cost <= MAX_COST:
            raise ValueError(f"cost must be a whole number from 0 to {MAX_COST:,}")
        largest = None if self.config is None else self.config.max_cost
        if largest is not None and cost > largest:
            raise TooBig(f"cost {cost} exceeds the smallest cost window's burst {largest}")

    def _take_spare(self, weight: int) -> Grant | None:
        with self._spares_lock:
            if self._spares_pid != os.getpid():
                self._spares, self._spares_pid = [], os.getpid()
            for i, spare in enumerate(self._spares):
                if spare.weight == weight:
                    return self._spares.pop(i)
        return None

    def _keep_spare(self, spare: Grant) -> None:
        with self._spares_lock:
            if self._spares_pid == os.getpid():
                self._spares.append(spare)

    def _single_steps(
        self,
        lease_id: str,
        weight: int,
        max_wait: float | None,
        lease_seconds: float,
        cost: int,
        keep_place: bool,
    ) -> Steps:
        """acquire(): confirm the spare slot an earlier grant reserved for this process (one
        round trip, and a new spare with it), else ask anew."""
        spares = self.spare_slots and cost == 0 and not keep_place
        spare = self._take_spare(weight) if spares else None
        if spare is None:
            return (
                yield from self._acquire_steps(
                    lease_id, weight, max_wait, lease_seconds,
                    cost=cost, keep_place=keep_place, spare=spares,
                )
            )  # fmt: skip
        started = time.monotonic()
        delay = spare.due - CONFIRM_AHEAD_SECONDS - started
        if max_wait is not None and delay > max_wait:
            self._keep_spare(spare)  # still this process's next slot
            raise WaitTooLong(spare.due - started)
        if delay > 0:
            yield Sleep(delay)
        return (
            yield from self._acquire_steps(
                lease_id,
                weight,
                None if max_wait is None else max(0.0, max_wait - (time.monotonic() - started)),
                lease_seconds,
                held_slot=spare.slot_us,
                held_generation=spare.generation,
                waited_before=time.monotonic() - started,
                spare=True,
            )
        )

    def _acquire_steps(
        self,
        lease_id: str,
        weight: int,
        max_wait: float | None,
        lease_seconds: float,
        *,
        held_slot: int = -1,
        held_generation: int = -1,
        waited_before: float = 0.0,
        cost: int = 0,
        cost_seq: int = -1,
        keep_place: bool = False,
        spare: bool = False,
    ) -> Steps:
        """Reserve and confirm a slot; or, given held_slot and held_generation (a reservation
        made by acquire_many, or a place kept before), only confirm that one, queueing again
        if it went stale. With keep_place, a slot beyond max_wait is reserved all the same
        (when acquire.lua keeps the place) and raised as WaitTooLong.place, as is a held one
        still further away than max_wait."""
        self._check_weight(weight)
        self._check_cost(cost)
        started = time.monotonic()  # max_wait counts from here
        requeued = 0
        while True:
            wait_left_us = _wait_left_us(max_wait, started)
            # Redis decides after this, so a deadline counted from it is never later than the
            # one Redis meant, however long the reply then waited for this caller to read it.
            asked = time.monotonic()
            reply = yield RunScript(
                "acquire",
                self.keys,
                [
                    weight,
                    lease_id,
                    int(lease_seconds * MICROS),
                    wait_left_us,
                    held_slot,
                    held_generation,
                    self._config_version(),
                    cost,
                    cost_seq if held_slot >= 0 else -1,
                    *self._history_args,
                    1 if keep_place else 0,
                    1 if spare else 0,
                ],
            )
            code, wait_us, slot_us, generation, now_us, seq, leased, spare_us, late_us = map(
                int, reply
            )
            received = time.monotonic()
            self._read_clock(now_us, received)
            if seq >= 0:
                cost_seq = seq
            if spare_us >= 0:
                self._keep_spare(
                    Grant(
                        lease_id="",
                        weight=weight,
                        slot_us=spare_us,
                        granted_us=now_us,
                        generation=generation,
                        waited=0.0,
                        ready=False,
                        due=received + (spare_us - now_us) / MICROS,
                        lease_seconds=lease_seconds,
                        leased=False,
                    )
                )
            if held_slot >= 0 and slot_us != held_slot:
                requeued += 1
            if code == GRANTED:
                if wait_us > 0:  # confirmed ahead of its slot: leave at the slot
                    yield Sleep(wait_us / MICROS)
                return Grant(
                    lease_id=lease_id,
                    weight=weight,
                    slot_us=slot_us,
                    granted_us=max(now_us, slot_us),
                    generation=generation,
                    waited=waited_before + time.monotonic() - started,
                    requeued=requeued,
                    lease_seconds=lease_seconds,
                    cost=cost,
                    cost_seq=cost_seq,
                    leased=bool(leased),
                    stale_at=asked
                    + (slot_us - now_us) / MICROS
                    + max(late_us / MICROS, STALE_GRANT_MIN_SECONDS),
                )
            if code == WAIT and keep_place and 0 <= wait_left_us < wait_us:
                place = Grant(
                    lease_id=lease_id,
                    weight=weight,
                    slot_us=slot_us,
                    granted_us=now_us,
                    generation=generation,
                    waited=waited_before + received - started,
                    requeued=requeued,
                    ready=False,
                    due=received + wait_us / MICROS,
                    lease_seconds=lease_seconds,
                    cost=cost,
                    cost_seq=cost_seq,
                    leased=bool(leased),
                )
                raise WaitTooLong(wait_us / MICROS, place=place)
            if code == WAIT:
                held_slot, held_generation = slot_us, generation
                ahead = wait_us / MICROS - CONFIRM_AHEAD_SECONDS
                yield Sleep(max(0.0, min(ahead, MAX_SLEEP_SECONDS)))
            elif code == TOO_LONG:
                raise WaitTooLong(wait_us / MICROS)
            elif code == AT_CAPACITY:
                held_slot = held_generation = -1
                if max_wait is not None and time.monotonic() - started >= max_wait:
                    raise WaitTooLong(max(wait_us, 0) / MICROS, at_capacity=True)
                wait = min(max(wait_us, 1_000) / MICROS, MAX_CAPACITY_WAIT_SECONDS)
                yield AwaitRelease(self.released_key, wait)
            elif code == NOT_CONFIGURED:
                yield from self._configure_from_own()
            else:
                raise LimiterError(f"unexpected reply from acquire.lua: {reply!r}")

    def _acquire_many_steps(
        self,
        count: int,
        weight: int,
        max_wait: float | None,
        lease_seconds: float,
        costs: Sequence[int] | None = None,
        wait_for_room: bool = True,
    ) -> Steps:
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_BATCH:
            raise ValueError(f"count must be a whole number from 1 to {MAX_BATCH}")
        self._check_weight(weight)
        costs = [0] * count if costs is None else list(costs)
        if len(costs) != count:
            raise ValueError("costs must give one cost per slot")
        for cost in costs:
            self._check_cost(cost)
        costs_arg = ",".join(map(str, costs)) if any(costs) else ""
        prefix = new_lease_id()
        started = time.monotonic()
        while True:
            reply = yield RunScript(
                "acquire_many",
                self.keys,
                [
                    weight,
                    count,
                    prefix,
                    int(lease_seconds * MICROS),
                    _wait_left_us(max_wait, started),
                    self._config_version(),
                    costs_arg,
                    *self._history_args,
                ],
            )
            received = time.monotonic()
            code, hint_us, generation, now_us = (int(x) for x in reply[:4])
            self._read_clock(now_us, received)
            seqs = [int(x) for x in _text(reply[4]).split(",") if x]
            leased = bool(int(reply[5]))
            slots = [int(x) for x in reply[6:]]
            if code == NOT_CONFIGURED:
                yield from self._configure_from_own()
                continue
            if code not in (GRANTED, TOO_LONG, AT_CAPACITY):
                raise LimiterError(f"unexpected reply from acquire_many.lua: {reply[:4]!r}")
            if code == AT_CAPACITY and not slots and wait_for_room:
                # Nothing fits yet: wait for a release, as acquire does, within max_wait.
                left = None if max_wait is None else max_wait - (received - started)
                if left is None or left > 0:
                    wait = min(max(hint_us, 1_000) / MICROS, MAX_CAPACITY_WAIT_SECONDS)
                    yield AwaitRelease(self.released_key, wait if left is None else min(wait, left))
                    continue
            waited = received - started
            grants = tuple(
                Grant(
                    lease_id=f"{prefix}:{i}",
                    weight=weight,
                    slot_us=slot,
                    granted_us=now_us,
                    generation=generation,
                    waited=waited,
                    ready=slot <= now_us,
                    due=received + (slot - now_us) / MICROS,
                    lease_seconds=lease_seconds,
                    cost=costs[i - 1],
                    cost_seq=seqs[i - 1],
                    leased=leased,
                )
                for i, slot in enumerate(slots, start=1)
            )
            retry_after = max(hint_us, 0) / MICROS if code != GRANTED else 0.0
            return GrantBatch(
                grants,
                requested=count,
                retry_after=retry_after,
                now_us=now_us,
                at_capacity=code == AT_CAPACITY,
            )

    def _confirm_steps(
        self, grant: Grant, max_wait: float | None, keep_place: bool = False
    ) -> Steps:
        if grant.ready:
            return grant
        delay = grant.due - CONFIRM_AHEAD_SECONDS - time.monotonic()
        # A kept place still beyond max_wait goes straight back to acquire.lua, which says so.
        handed_back = keep_place and max_wait is not None and delay > max_wait
        if delay > 0 and not handed_back:
            # Wake at least every MAX_SLEEP_SECONDS, as acquire does; acquire.lua says how much
            # of the wait is left.
            yield Sleep(min(delay, MAX_SLEEP_SECONDS))
        # When acquire_many's answer arrived, on this process's monotonic clock.
        answered = grant.due - (grant.slot_us - grant.granted_us) / MICROS
        return (
            yield from self._acquire_steps(
                grant.lease_id,
                grant.weight,
                max_wait,
                grant.lease_seconds,
                held_slot=grant.slot_us,
                held_generation=grant.generation,
                waited_before=grant.waited + max(0.0, time.monotonic() - answered),
                cost=grant.cost,
                cost_seq=grant.cost_seq,
                keep_place=keep_place,
            )
        )

    def _await_release_steps(self, timeout: float) -> Steps:
        reply = yield AwaitRelease(self.released_key, min(timeout, MAX_CAPACITY_WAIT_SECONDS))
        return reply is not None

    def _release_steps(self, lease_id: str) -> Steps:
        reply = yield RunScript(
            "release", [self.config_key, self.leases_key, self.released_key], ["", lease_id]
        )
        return bool(int(reply[0]))

    def _release_grant_steps(self, grant: Grant) -> Steps:
        if not grant.leased:
            return False
        return (yield from self._release_steps(grant.lease_id))

    def _release_many_steps(
        self, grants: Iterable[Grant], settles: Iterable[tuple[Grant, int]] = ()
    ) -> Steps:
        lease_ids = [grant.lease_id for grant in grants if grant.leased]
        corrections = [
            (delta, grant.cost_seq)
            for grant, cost in settles
            if (delta := self._cost_correction(grant, cost))
        ]
        if not lease_ids and not corrections:
            return 0
        keys = [self.config_key, self.leases_key, self.released_key]
        if corrections:
            keys += [self.state_key, self.heads_key]
        settled = ",".join(f"{delta}:{seq}" for delta, seq in corrections)
        reply = yield RunScript("release", keys, [settled, *lease_ids])
        return int(reply[0])

    def _feedback_steps(self, generation: int, block_seconds: float, throttled: bool) -> Steps:
        args = [
            generation,
            max(0, int(block_seconds * MICROS)),
            1 if throttled else 0,
            *self._history_args,
        ]
        keys = [self.config_key, self.state_key, self.rates_key]
        while True:
            reply = yield RunScript("feedback", keys, args)
            if int(reply[0]) != NOT_CONFIGURED:
                break
            yield from self._configure_from_own()
        self._read_clock(int(reply[4]), time.monotonic())
        return Feedback(
            accepted=bool(int(reply[1])),
            generation=int(reply[2]),
            blocked_until_us=int(reply[3]),
            now_us=int(reply[4]),
            rate_before=float(reply[5]),
            rate_after=float(reply[6]),
        )

    def _observe_steps(
        self,
        grant: Grant | None,
        status_code: int,
        headers: Mapping[str, str],
        default_block: float,
    ) -> Steps:
        now = yield from self._clock_steps()
        delay = throttle_delay(status_code, headers, now=now)
        throttled = is_throttle(status_code, delay)
        if throttled and delay is None:
            delay = default_block
        if not throttled and not delay:
            return None
        generation = grant.generation if grant is not None else -1
        return (yield from self._feedback_steps(generation, delay or 0.0, throttled))

    def _observe_many_steps(
        self,
        responses: Sequence[tuple[Grant | None, int, Mapping[str, str]]],
        default_block: float,
    ) -> Steps:
        now = yield from self._clock_steps()
        signalling: list[int] = []  # indexes of the responses that say something
        args: list[int] = [*self._history_args]
        for index, (grant, status_code, headers) in enumerate(responses):
            delay = throttle_delay(status_code, headers, now=now)
            throttled = is_throttle(status_code, delay)
            if throttled and delay is None:
                delay = default_block
            if not throttled and not delay:
                continue
            generation = grant.generation if grant is not None else -1
            signalling.append(index)
            args += [generation, max(0, int((delay or 0.0) * MICROS)), 1 if throttled else 0]
        results: list[Feedback | None] = [None] * len(responses)
        if not signalling:
            return results
        while True:
            reply = yield RunScript(
                "feedback_many", [self.config_key, self.state_key, self.rates_key], args
            )
            if int(reply[0]) != NOT_CONFIGURED:
                break
            yield from self._configure_from_own()
        now_us = int(reply[1])
        self._read_clock(now_us, time.monotonic())
        for index, item in zip(signalling, reply[2:], strict=True):
            results[index] = Feedback(
                accepted=bool(int(item[0])),
                generation=int(item[1]),
                blocked_until_us=int(item[2]),
                now_us=now_us,
                rate_before=float(item[3]),
                rate_after=float(item[4]),
            )
        return results

    def _clock_steps(self) -> Steps:
        """Now, in unix seconds on Redis's clock: followed from the last reading on this
        process's monotonic clock, read again (one round trip) when there is none that recent."""
        reading = self._clock_reading
        if reading is None or time.monotonic() - reading.monotonic > CLOCK_READING_MAX_AGE:
            reply = yield RunScript("clock", [self.config_key], [])
            reading = ClockReading(int(reply), time.monotonic())
            self._clock_reading = reading
        return reading.now(time.monotonic())

    def _read_clock(self, redis_us: int, received: float) -> None:
        if redis_us > 0:  # a NOT_CONFIGURED reply carries no time
            self._clock_reading = ClockReading(redis_us, received)

    def _cost_correction(self, grant: Grant, cost: int) -> int:
        """What settling `grant` at its real `cost` charges (above 0) or gives back (below 0):
        0 when it is what the grant took, or when the limiter has no cost window."""
        if not isinstance(cost, int) or isinstance(cost, bool) or cost < 0:
            raise ValueError("cost must be a whole number >= 0")
        if self.config is not None and self.config.max_cost is None:
            return 0
        return cost - grant.cost

    def _settle_steps(self, grant: Grant, cost: int) -> Steps:
        """Charge (or give back) the difference between `grant`'s cost and the real one."""
        delta = self._cost_correction(grant, cost)
        if delta == 0:
            return False
        reply = yield RunScript(
            "settle", [self.config_key, self.state_key, self.heads_key], [delta, grant.cost_seq]
        )
        return int(reply[0]) == 0

    def _reset_steps(self) -> Steps:
        """Forget the live state (pace, block, leases, adaptive rate, rate history); keep the
        configuration."""
        yield Delete([f"{self._base}:{part}" for part in LIVE_KEY_PARTS])

    def _delete_steps(self) -> Steps:
        """Remove every key of the limiter, its configuration too."""
        yield Delete(list(self.keys))

    def _rate_history_steps(self, since: float | None) -> Steps:
        """The samples since `since` (unix seconds; None: all kept), oldest first."""
        low = "-inf" if since is None else int(since * MICROS)
        members = yield ReadRange(self.rates_key, low, "+inf")
        return [_rate_sample(member) for member in members]

    def _state_steps(self) -> Steps:
        reply = yield RunScript("state", [self.config_key, self.state_key, self.leases_key], [])
        # state.lua's reply by name; without a config hash only now_us and counts are there.
        field = _by_name(reply)
        return LimiterState(
            name=self.name,
            configured=bool(int(field["configured"])),
            now_us=int(field["now_us"]),
            rate=float(field.get("rate", 0)),
            period=float(field.get("period", 0)),
            burst=int(field.get("burst", 0)),
            max_concurrency=int(field.get("max_concurrency", 0)),
            adaptive=bool(int(field.get("adaptive", 0))),
            min_rate=float(field.get("min_rate", 0)),
            current_rate=float(field.get("current_rate", 0)),
            next_free_us=int(field.get("next_free_us", 0)),
            blocked_until_us=int(field.get("blocked_until_us", 0)),
            in_flight=int(field.get("in_flight", 0)),
            generation=int(field.get("generation", 0)),
            counts=LimiterCounts(**{name: int(n) for name, n in _by_name(field["counts"]).items()}),
            config_version=int(field.get("config_version", 0)),
            learned_rate=_learned_rate(field.get("learned_rate")),
            windows=tuple(_window_state(_by_name(item)) for item in field.get("windows", [])),
        )


def _by_name(reply: Sequence[Any]) -> dict[str, Any]:
    """A Lua reply of alternating names and values (as HGETALL's) as a dict."""
    return {_text(name): value for name, value in zip(reply[::2], reply[1::2], strict=True)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _window_state(field: dict[str, Any]) -> WindowState:
    return WindowState(
        window=Window(
            rate=float(field["rate"]),
            period=float(field["period"]),
            burst=int(field["burst"]),
            unit=_text(field["unit"]),
        ),
        remaining=float(field["remaining"]),
        next_free_in=int(field["next_free_in_us"]) / MICROS,
        full_in=int(field["full_in_us"]) / MICROS,
    )


def _rate_sample(member: Any) -> RateSample:
    """One member of the rate history: "<at_us>:<rate>:<period>:<grants>" (lib/history.lua)."""
    at_us, rate, period, grants = _text(member).split(":")
    return RateSample(
        at=int(float(at_us)) / MICROS, rate=float(rate), period=float(period), grants=int(grants)
    )


def _learned_rate(value: Any) -> float | None:
    """state.lua's learned rate: a number as a string, '' (or 0) when nothing was learned."""
    if value in (None, b"", ""):
        return None
    rate = float(value)
    return rate if rate > 0 else None
