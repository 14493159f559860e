"""The limiter for threads and processes (Celery workers): blocking calls on a redis-py client."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from functools import cached_property
from typing import Any

import redis
from redis.utils import HIREDIS_AVAILABLE

from ratejobs.limiter.config import LimiterConfig
from ratejobs.limiter.core import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_THROTTLE_BLOCK_SECONDS,
    AwaitRelease,
    Delete,
    Feedback,
    Grant,
    GrantBatch,
    LimiterBase,
    LimiterState,
    RateSample,
    ReadRange,
    RunScript,
    Sleep,
    Steps,
    new_lease_id,
    translate_redis_errors,
)
from ratejobs.limiter.errors import LimiterError, LimiterUnavailable, WaitTooLong
from ratejobs.limiter.scripts import FUNCTION_LIBRARY, FUNCTION_NAMES

if HIREDIS_AVAILABLE:
    import hiredis


class _HeldConnection:
    """One connection this process keeps out of a client's pool to run the limiter's scripts
    on: a command written on it and read back costs a fraction of the client CPU of redis-py's
    generic command path (pool check-out and return, the retry wrapper, response callbacks,
    its metrics hooks), which was most of a single acquire's (docs/benchmarks.md). One per pool
    and process, shared by every limiter on that client; a thread that finds it in use takes
    the generic path instead of waiting.

    On it the scripts run as functions of one library (FCALL), loaded the first time a call
    finds it missing: Redis then skips the library's definitions that every EVALSHA runs again.
    A Redis without functions (before 7.0) or a user the ACL denies them keeps EVALSHA."""

    def __init__(self, pool: Any) -> None:
        self.lock = threading.Lock()
        self.connection: Any = None
        self.pid = os.getpid()
        # redis-py's own packer when hiredis is there (it hands the arguments to
        # hiredis.pack_command as they are), without its per-argument Python loop.
        self.hiredis = HIREDIS_AVAILABLE and pool.connection_kwargs.get("command_packer") is None
        # None until the first call tells whether this Redis runs our functions.
        self.functions: bool | None = None

    def run(self, pool: Any, name: str, sha: str, keys: list[str], args: list[Any]) -> Any:
        """Script `name`'s reply, or _GENERIC when the caller must run it on the generic path:
        the connection is in another thread's hands, the script is not loaded (the generic path
        loads it), or the connection failed (the generic path applies the client's retries and
        raises what it raises today; like those retries, it may run a script whose reply was
        lost a second time)."""
        if not self.lock.acquire(blocking=False):
            return _GENERIC
        try:
            connection = self.connection
            if connection is None or self.pid != os.getpid():
                # The first use, or a forked child whose hook did not run: never the parent's.
                connection = self.connection = pool.get_connection()
                self.pid = os.getpid()
            if self.functions is not False:
                reply = self._call_function(connection, name, keys, args)
                if reply is not _NO_FUNCTIONS:
                    return reply
            return self._send(connection, ("EVALSHA", sha, len(keys), *keys, *args))
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.NoScriptError):
            # redis-py disconnected it on a connection error; the next send reconnects.
            return _GENERIC
        finally:
            self.lock.release()

    def _call_function(self, connection: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        command = ("FCALL", FUNCTION_NAMES[name], len(keys), *keys, *args)
        try:
            return self._send(connection, command)
        except redis.ResponseError as error:
            if not _function_missing(error):
                if self.functions is None and _functions_refused(error):
                    self.functions = False
                    return _NO_FUNCTIONS
                raise
        # Not loaded yet, or forgotten (a restart, FUNCTION FLUSH, a failover to a replica
        # that never had it); another process may be loading it at the same moment.
        try:
            self._send(connection, ("FUNCTION", "LOAD", FUNCTION_LIBRARY))
        except redis.ResponseError as error:
            if "already exists" not in str(error):
                if not _functions_refused(error):
                    raise
                self.functions = False
                return _NO_FUNCTIONS
        self.functions = True
        return self._send(connection, command)

    def _send(self, connection: Any, command: tuple[Any, ...]) -> Any:
        if self.hiredis:
            connection.send_packed_command([hiredis.pack_command(command)])
        else:
            connection.send_packed_command(connection.pack_command(*command))
        return connection.read_response()

    def forget(self) -> None:
        """In a forked child: the parent's socket is not ours to use (redis-py's pool starts
        afresh there too), nor is a lock another thread of the parent held."""
        self.lock = threading.Lock()
        self.connection = None
        self.pid = os.getpid()


def _function_missing(error: redis.ResponseError) -> bool:
    return str(error).startswith("Function not found")


def _functions_refused(error: redis.ResponseError) -> bool:
    """A Redis before 7.0 (no FCALL or FUNCTION), or an ACL that denies them."""
    return isinstance(error, redis.exceptions.NoPermissionError) or str(error).startswith(
        "unknown command"
    )


_GENERIC = object()
_NO_FUNCTIONS = object()
_HELD: weakref.WeakKeyDictionary[Any, _HeldConnection] = weakref.WeakKeyDictionary()
_HELD_GUARD = threading.Lock()


def _forget_held_connections() -> None:
    for held in list(_HELD.values()):
        held.forget()


os.register_at_fork(after_in_child=_forget_held_connections)


def _held_connection(client: Any) -> _HeldConnection | None:
    """The connection kept for `client`'s pool, or None where the generic path stays: Redis
    Cluster (a client per node), a single-connection client, a pool with a client-side cache,
    and a BlockingConnectionPool, whose users would wait for the place it takes."""
    pool = getattr(client, "connection_pool", None)
    if (
        not isinstance(client, redis.Redis)
        or client.connection is not None
        or not isinstance(pool, redis.ConnectionPool)
        or isinstance(pool, redis.BlockingConnectionPool)
        or getattr(pool, "cache", None) is not None
    ):
        return None
    with _HELD_GUARD:
        held = _HELD.get(pool)
        if held is None:
            held = _HELD[pool] = _HeldConnection(pool)
        return held


class Limiter(LimiterBase):
    """One API's shared limiter on a `redis.Redis` (or `RedisCluster`) client.

    Every decision runs atomically in Redis on Redis's clock, so all processes and machines using
    the same name share one pace, one block and one in-flight cap. When Redis cannot be reached
    every method raises LimiterUnavailable: nothing may be sent.
    """

    @cached_property
    def _held(self) -> _HeldConnection | None:
        return _held_connection(self.client)

    def configure(self, config: LimiterConfig) -> bool:
        """Store limits; they apply from the next grant. Returns whether anything changed."""
        return self._run(self._configure_steps(config))

    def acquire(
        self,
        weight: int = 1,
        *,
        max_wait: float | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        cost: int = 0,
        keep_place: bool = False,
    ) -> Grant:
        """Wait for a slot and an in-flight lease; raise WaitTooLong past max_wait seconds.

        With keep_place, a slot past max_wait is reserved all the same when it is within four
        times the time the request's own units take to refill beyond max_wait (a large cost would
        otherwise wait for ever behind smaller ones): WaitTooLong.place holds it, to pass to
        confirm() when it comes. A place nobody confirms is wasted, and its lease expires."""
        lease_id = new_lease_id()
        try:
            return self._run(
                self._single_steps(lease_id, weight, max_wait, lease_seconds, cost, keep_place)
            )
        except (WaitTooLong, LimiterUnavailable, ValueError):
            raise
        except BaseException:
            # Interrupted while holding a lease (a time limit, a signal): give it back now
            # rather than at its expiry.
            self._release_quietly(lease_id)
            raise

    def release(self, grant: Grant) -> bool:
        if not grant.leased:
            return False  # no in-flight cap, no lease (L1): skip even the steps' set-up
        return self._run(self._release_grant_steps(grant))

    def acquire_many(
        self,
        count: int,
        *,
        max_wait: float | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        weight: int = 1,
        costs: Sequence[int] | None = None,
        wait_for_room: bool = True,
    ) -> GrantBatch:
        """Reserve up to `count` consecutive slots, each with its own lease, in one round trip.

        Only slots within max_wait seconds are reserved and only as many as the in-flight cap
        allows: fewer than asked (perhaps none, with retry_after) rather than a longer wait.
        When nothing fits under the cap it waits for a release, as acquire does, up to
        max_wait (without wait_for_room it returns none at once). Grants whose slot has not
        come yet (not ready) go through confirm() right before their request is sent; release
        them all with release_many().
        """
        return self._run(
            self._acquire_many_steps(count, weight, max_wait, lease_seconds, costs, wait_for_room)
        )

    def confirm(
        self, grant: Grant, *, max_wait: float | None = None, keep_place: bool = False
    ) -> Grant:
        """Sleep until a reserved grant's slot, then confirm it in Redis as acquire does: a
        block, a rate cut or new limits since the reservation put it back in the queue (under
        the same lease), and max_wait bounds that extra wait (WaitTooLong frees the lease).
        A ready grant comes back at once, with no round trip. With keep_place, a place still
        further away than max_wait (or made again so) comes back as WaitTooLong.place.
        """
        try:
            return self._run(self._confirm_steps(grant, max_wait, keep_place))
        except WaitTooLong:
            raise  # TOO_LONG gave the lease back; a kept place (exc.place) holds it
        except BaseException:
            # The reservation's lease is held whatever stopped the confirm (limits shrunk below
            # its weight or cost, Redis gone, a signal): on an API with an in-flight cap it
            # would keep a place taken until it expires, tens of seconds later.
            if grant.leased:
                self._release_quietly(grant.lease_id)
            raise

    def await_release(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds (at most MAX_CAPACITY_WAIT_SECONDS) for a released
        in-flight place: True when one was released (its wake-up is this caller's)."""
        return self._run(self._await_release_steps(timeout))

    def release_many(
        self, grants: Iterable[Grant], settles: Iterable[tuple[Grant, int]] = ()
    ) -> int:
        """Give back several leases in one round trip; returns how many were still held.
        `settles` pairs grants with their real cost, settled (see settle) in the same trip."""
        return self._run(self._release_many_steps(grants, settles))

    @contextmanager
    def slot(
        self,
        weight: int = 1,
        *,
        max_wait: float | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> Iterator[Grant]:
        grant = self.acquire(weight, max_wait=max_wait, lease_seconds=lease_seconds)
        try:
            yield grant
        finally:
            if grant.leased:
                self._release_quietly(grant.lease_id)

    def block(self, seconds: float) -> Feedback:
        """Stop every caller for `seconds`, including those already holding a future slot."""
        return self._run(self._feedback_steps(-1, seconds, False))

    def report_throttle(self, grant: Grant | None, *, block_seconds: float = 0.0) -> Feedback:
        """The API throttled `grant`'s request: block, and cut the adaptive rate once per burst."""
        generation = grant.generation if grant is not None else -1
        return self._run(self._feedback_steps(generation, block_seconds, True))

    def observe(
        self,
        grant: Grant | None,
        status_code: int,
        headers: Mapping[str, str],
        *,
        default_block: float = DEFAULT_THROTTLE_BLOCK_SECONDS,
    ) -> Feedback | None:
        """Feed a response's status and rate-limit headers back; None when they say nothing."""
        return self._run(self._observe_steps(grant, status_code, headers, default_block))

    def observe_many(
        self,
        responses: Sequence[tuple[Grant | None, int, Mapping[str, str]]],
        *,
        default_block: float = DEFAULT_THROTTLE_BLOCK_SECONDS,
    ) -> list[Feedback | None]:
        """observe() for several (grant, status code, headers) at once, in one round trip (none
        when no response says anything); one Feedback or None per response, in order. The 429s
        of one burst still cut the adaptive rate once, as they do one at a time.
        """
        return self._run(self._observe_many_steps(responses, default_block))

    def settle(self, grant: Grant, cost: int) -> bool:
        """The real cost of `grant`'s request is known (the tokens it used): charge the
        difference to the cost windows, or give it back. False when nothing was changed (the
        same cost, no cost window, or limiter state lost with Redis)."""
        return self._run(self._settle_steps(grant, cost))

    def clock(self) -> float:
        """Now, in unix seconds on Redis's clock: the clock of every decision, shared by all
        workers whatever their own clocks say. Free while a reply of the last minute carried
        it; one round trip otherwise."""
        return self._run(self._clock_steps())

    def state(self) -> LimiterState:
        return self._run(self._state_steps())

    def reset(self) -> None:
        self._run(self._reset_steps())

    def delete(self) -> None:
        """Remove the limiter from Redis, its limits too, as for a bucket nobody will use again
        (a deleted credential's); a later use configures it afresh."""
        self._run(self._delete_steps())

    def rate_history(self, since: float | None = None) -> list[RateSample]:
        """The rate over time, oldest first: samples taken as grants were made (at most one per
        RATE_SAMPLE_SECONDS) and at each rate cut, since `since` (unix seconds; None: every
        sample kept, the newest RATE_SAMPLES_KEPT)."""
        return self._run(self._rate_history_steps(since))

    # -- performing steps -------------------------------------------------------------------

    def _release_quietly(self, lease_id: str) -> None:
        with suppress(LimiterError):  # the lease expires by itself
            self._run(self._release_steps(lease_id))

    def _run(self, steps: Steps) -> Any:
        reply = None
        try:
            while True:
                reply = self._perform(steps.send(reply))
        except StopIteration as done:
            return done.value

    def _call_function_generic(self, step: RunScript) -> Any:
        """The script as a function on the generic path (its connection was in another
        thread's hands), once this Redis is known to have the library; _GENERIC when it has
        been forgotten since (EVALSHA then, and the held connection loads it again)."""
        try:
            return self.client.fcall(
                FUNCTION_NAMES[step.name], len(step.keys), *step.keys, *step.args
            )
        except redis.ResponseError as error:
            if not _function_missing(error):
                raise
            return _GENERIC

    def _perform(self, step: Any) -> Any:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        self.round_trips += 1
        with translate_redis_errors(self.name):
            if isinstance(step, RunScript):
                script = self._scripts[step.name]
                if self._held is not None:
                    reply = self._held.run(
                        self.client.connection_pool, step.name, script.sha, step.keys, step.args
                    )
                    if reply is not _GENERIC:
                        return reply
                    if self._held.functions:
                        reply = self._call_function_generic(step)
                        if reply is not _GENERIC:
                            return reply
                return script(keys=step.keys, args=step.args)
            if isinstance(step, AwaitRelease):
                return self.client.blpop([step.key], timeout=step.seconds)
            if isinstance(step, Delete):
                return self.client.delete(*step.keys)
            if isinstance(step, ReadRange):
                return self.client.zrangebyscore(step.key, step.low, step.high)
        raise TypeError(f"unknown step {step!r}")
