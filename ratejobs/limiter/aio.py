"""The limiter for asyncio programs (aiohttp, httpx) on redis.asyncio: the same scripts and keys
as the sync limiter, so both kinds of caller share one bucket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

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


class AsyncLimiter(LimiterBase):
    """One API's shared limiter on a `redis.asyncio.Redis` client; see Limiter."""

    async def configure(self, config: LimiterConfig) -> bool:
        return await self._run(self._configure_steps(config))

    async def acquire(
        self,
        weight: int = 1,
        *,
        max_wait: float | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        cost: int = 0,
        keep_place: bool = False,
    ) -> Grant:
        lease_id = new_lease_id()
        try:
            return await self._run(
                self._single_steps(lease_id, weight, max_wait, lease_seconds, cost, keep_place)
            )
        except (WaitTooLong, LimiterUnavailable, ValueError):
            raise
        except BaseException:
            # Cancelled while holding a lease: give it back now rather than at its expiry.
            await self._release_quietly(lease_id)
            raise

    async def release(self, grant: Grant) -> bool:
        return await self._run(self._release_grant_steps(grant))

    async def acquire_many(
        self,
        count: int,
        *,
        max_wait: float | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        weight: int = 1,
        costs: Sequence[int] | None = None,
        wait_for_room: bool = True,
    ) -> GrantBatch:
        return await self._run(
            self._acquire_many_steps(count, weight, max_wait, lease_seconds, costs, wait_for_room)
        )

    async def confirm(
        self, grant: Grant, *, max_wait: float | None = None, keep_place: bool = False
    ) -> Grant:
        try:
            return await self._run(self._confirm_steps(grant, max_wait, keep_place))
        except WaitTooLong:
            raise  # TOO_LONG gave the lease back; a kept place (exc.place) holds it
        except BaseException:
            # The reservation's lease is held whatever stopped the confirm (limits shrunk below
            # its weight or cost, Redis gone, a signal): on an API with an in-flight cap it
            # would keep a place taken until it expires, tens of seconds later.
            if grant.leased:
                await self._release_quietly(grant.lease_id)
            raise

    async def await_release(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds (at most MAX_CAPACITY_WAIT_SECONDS) for a released
        in-flight place: True when one was released (its wake-up is this caller's)."""
        return await self._run(self._await_release_steps(timeout))

    async def release_many(
        self, grants: Iterable[Grant], settles: Iterable[tuple[Grant, int]] = ()
    ) -> int:
        return await self._run(self._release_many_steps(grants, settles))

    @asynccontextmanager
    async def slot(
        self,
        weight: int = 1,
        *,
        max_wait: float | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> AsyncIterator[Grant]:
        grant = await self.acquire(weight, max_wait=max_wait, lease_seconds=lease_seconds)
        try:
            yield grant
        finally:
            if grant.leased:
                await self._release_quietly(grant.lease_id)

    async def block(self, seconds: float) -> Feedback:
        return await self._run(self._feedback_steps(-1, seconds, False))

    async def report_throttle(self, grant: Grant | None, *, block_seconds: float = 0.0) -> Feedback:
        generation = grant.generation if grant is not None else -1
        return await self._run(self._feedback_steps(generation, block_seconds, True))

    async def observe(
        self,
        grant: Grant | None,
        status_code: int,
        headers: Mapping[str, str],
        *,
        default_block: float = DEFAULT_THROTTLE_BLOCK_SECONDS,
    ) -> Feedback | None:
        return await self._run(self._observe_steps(grant, status_code, headers, default_block))

    async def observe_many(
        self,
        responses: Sequence[tuple[Grant | None, int, Mapping[str, str]]],
        *,
        default_block: float = DEFAULT_THROTTLE_BLOCK_SECONDS,
    ) -> list[Feedback | None]:
        return await self._run(self._observe_many_steps(responses, default_block))

    async def settle(self, grant: Grant, cost: int) -> bool:
        """The real cost of `grant`'s request is known (the tokens it used): charge the
        difference to the cost windows, or give it back. False when nothing was changed (the
        same cost, no cost window, or limiter state lost with Redis)."""
        return await self._run(self._settle_steps(grant, cost))

    async def clock(self) -> float:
        """Now, in unix seconds on Redis's clock: the clock of every decision, shared by all
        workers whatever their own clocks say. Free while a reply of the last minute carried
        it; one round trip otherwise."""
        return await self._run(self._clock_steps())

    async def state(self) -> LimiterState:
        return await self._run(self._state_steps())

    async def reset(self) -> None:
        await self._run(self._reset_steps())

    async def delete(self) -> None:
        """Limiter.delete()."""
        await self._run(self._delete_steps())

    async def rate_history(self, since: float | None = None) -> list[RateSample]:
        """The rate over time, oldest first: samples taken as grants were made (at most one per
        RATE_SAMPLE_SECONDS) and at each rate cut, since `since` (unix seconds; None: every
        sample kept, the newest RATE_SAMPLES_KEPT)."""
        return await self._run(self._rate_history_steps(since))

    async def _release_quietly(self, lease_id: str) -> None:
        with suppress(LimiterError, asyncio.CancelledError):  # the lease expires by itself
            await asyncio.shield(self._run(self._release_steps(lease_id)))

    async def _run(self, steps: Steps) -> Any:
        reply = None
        try:
            while True:
                reply = await self._perform(steps.send(reply))
        except StopIteration as done:
            return done.value

    async def _perform(self, step: Any) -> Any:
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        self.round_trips += 1
        with translate_redis_errors(self.name):
            if isinstance(step, RunScript):
                return await self._scripts[step.name](keys=step.keys, args=step.args)
            if isinstance(step, AwaitRelease):
                return await self.client.blpop([step.key], timeout=step.seconds)
            if isinstance(step, Delete):
                return await self.client.delete(*step.keys)
            if isinstance(step, ReadRange):
                return await self.client.zrangebyscore(step.key, step.low, step.high)
        raise TypeError(f"unknown step {step!r}")
