"""The limiter for threads and processes (Celery workers): blocking calls on a redis-py client."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

from ratejobs.limiter.config import LimiterConfig
from ratejobs.limiter.core import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_THROTTLE_BLOCK_SECONDS,
    AwaitRelease,
    Delete,
    Feedback,
    Grant,
    LimiterBase,
    LimiterState,
    RunScript,
    Sleep,
    Steps,
    new_lease_id,
    translate_redis_errors,
)
from ratejobs.limiter.errors import LimiterError, LimiterUnavailable, WaitTooLong


class Limiter(LimiterBase):
    """One API's shared limiter on a `redis.Redis` (or `RedisCluster`) client.

    Every decision runs atomically in Redis on Redis's clock, so all processes and machines using
    the same name share one pace, one block and one in-flight cap. When Redis cannot be reached
    every method raises LimiterUnavailable: nothing may be sent.
    """

    def configure(self, config: LimiterConfig) -> bool:
        """Store limits; they apply from the next grant. Returns whether anything changed."""
        return self._run(self._configure_steps(config))

    def acquire(
        self,
        weight: int = 1,
        *,
        max_wait: float | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> Grant:
        """Wait for a slot and an in-flight lease; raise WaitTooLong past max_wait seconds."""
        lease_id = new_lease_id()
        try:
            return self._run(self._acquire_steps(lease_id, weight, max_wait, lease_seconds))
        except (WaitTooLong, LimiterUnavailable, ValueError):
            raise
        except BaseException:
            # Interrupted while holding a lease (a time limit, a signal): give it back now
            # rather than at its expiry.
            self._release_quietly(lease_id)
            raise

    def release(self, grant: Grant) -> bool:
        return self._run(self._release_steps(grant.lease_id))

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

    def state(self) -> LimiterState:
        return self._run(self._state_steps())

    def reset(self) -> None:
        self._run(self._reset_steps())

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

    def _perform(self, step: Any) -> Any:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        self.round_trips += 1
        with translate_redis_errors(self.name):
            if isinstance(step, RunScript):
                return self._scripts[step.name](keys=step.keys, args=step.args)
            if isinstance(step, AwaitRelease):
                return self.client.blpop([step.key], timeout=step.seconds)
            if isinstance(step, Delete):
                return self.client.delete(*step.keys)
        raise TypeError(f"unknown step {step!r}")
