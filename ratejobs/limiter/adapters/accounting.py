"""What every adapter does around a request, whatever its HTTP client: the slot's estimate, a slot
taken again when the request could only leave a whole slot late, whether a response was a
throttle to retry after the shared block, and the lease and cost given back once the response is
done (one round trip for both, none when there is nothing to give)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from ratejobs.limiter.core import DEFAULT_LEASE_SECONDS, Feedback, Grant
from ratejobs.limiter.cost import COST_JSON_FIELD, cost_from_response
from ratejobs.limiter.headers import is_throttle

logger = logging.getLogger("ratejobs.limiter.adapters")
Response = TypeVar("Response")

# How long a request waits for its slot by default before WaitTooLong: a pace of a few per
# minute still gets through, a bucket blocked for an hour says so.
DEFAULT_MAX_WAIT = 60.0
# A stale grant (Grant.stale_at) is given up for a new slot at most this often per attempt: once
# right before the request is handed to the client, once more where the client says it writes
# it (after opening a connection). A loop that stalls at every try still sends, late, rather
# than queueing for ever.
MAX_RENEWALS = 2
# A JSON cost is read from a body of at most this many bytes (an LLM API's usage object comes
# in a few KB); a larger body is not kept for it, and leaves the estimate standing.
MAX_COST_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class Accounting:
    """An adapter's settings: how long to wait for a slot, how many throttled attempts to make
    again, what a request is estimated to cost, and where its response says what it cost."""

    max_wait: float | None = DEFAULT_MAX_WAIT
    retries: int = 0
    cost: int | Callable[[Any], int] = 0
    cost_header: str = ""
    cost_json_field: str = ""
    lease_seconds: float = DEFAULT_LEASE_SECONDS

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ValueError("retries must be a whole number, 0 or more")
        if self.max_wait is not None and not self.max_wait >= 0:
            raise ValueError("max_wait must be None (no limit) or 0 or more seconds")
        if not callable(self.cost) and (not isinstance(self.cost, int) or self.cost < 0):
            raise ValueError("cost must be a whole number, 0 or more, or a function of the request")
        if self.cost_json_field and not COST_JSON_FIELD.fullmatch(self.cost_json_field):
            raise ValueError("cost_json_field must be a dotted path of names: usage.total_tokens")

    def estimate(self, request: Any) -> int:
        """What the request takes from the cost windows when its slot is granted."""
        return self.cost(request) if callable(self.cost) else self.cost

    @property
    def reads_body(self) -> bool:
        return bool(self.cost_json_field)

    def acquire_options(self, request: Any) -> dict[str, Any]:
        """The keyword arguments of the limiter's acquire() for `request`."""
        return {
            "max_wait": self.max_wait,
            "lease_seconds": self.lease_seconds,
            "cost": self.estimate(request),
        }


# The keyword arguments every adapter takes for its Accounting.
ACCOUNTING_OPTIONS = tuple(field.name for field in fields(Accounting))


def is_throttled(status_code: int, feedback: Feedback | None) -> bool:
    """is_throttle() from what observe() answered: it fed back a Feedback for a response whose
    headers hinted at a wait, so the hint is not read from the headers a second time."""
    return is_throttle(status_code, None if feedback is None else feedback.blocked_for)


class Finish:
    """Gives a response's lease back and settles its real cost, once, from whichever place ends
    it first (the body read to its end, or the response closed early)."""

    def __init__(
        self, limiter: Any, grant: Grant, accounting: Accounting, headers: Mapping[str, str]
    ) -> None:
        self.limiter = limiter
        self.grant = grant
        self.accounting = accounting
        self.headers = headers
        self._lock = threading.Lock()
        self._done = False
        self.renewals = 0

    def now(self) -> bool:
        """Whether nothing waits for the body: no lease to hold while it comes, no cost to read
        from it (a cost header's is settled at once)."""
        return not self.grant.leased and not self.accounting.reads_body

    def take(self) -> bool:
        """True the first time: the caller gives the lease back (settles(), release_many)."""
        with self._lock:
            done, self._done = self._done, True
            return not done

    def settles(self, body: bytes | None) -> list[tuple[Grant, int]]:
        used = cost_from_response(
            self.headers,
            body or b"",
            header=self.accounting.cost_header,
            json_field=self.accounting.cost_json_field if body is not None else "",
        )
        return [] if used is None else [(self.grant, used)]

    def __call__(self, body: bytes | None = None) -> None:
        """Synchronously (Limiter): give back the lease, settle the cost."""
        if not self.take():
            return
        try:
            self.limiter.release_many([self.grant], settles=self.settles(body))
        except Exception as exc:  # the lease expires by itself; the estimate stands
            logger.warning("limiter %r: lease or cost not given back: %s", self.limiter.name, exc)

    async def finish_async(self, body: bytes | None = None) -> None:
        """The same with an AsyncLimiter."""
        if not self.take():
            return
        try:
            await self.limiter.release_many([self.grant], settles=self.settles(body))
        except Exception as exc:
            logger.warning("limiter %r: lease or cost not given back: %s", self.limiter.name, exc)

    def must_renew(self) -> bool:
        """Whether the grant went stale before its request left, with a renewal left to
        replace it (counted here)."""
        if self._done or self.renewals >= MAX_RENEWALS or not self.grant.stale:
            return False
        self.renewals += 1
        return True

    def _given_up(self) -> tuple[list[Grant], list[tuple[Grant, int]]]:
        # Its slot went by unused: the lease, and the cost it took from the cost windows, go
        # back (a refund is capped by the windows' headroom, settle.lua).
        grant = self.grant
        return [grant], ([(grant, 0)] if grant.cost else [])

    def renew(self, request: Any) -> None:
        """Give up the stale grant, then wait for a new slot (WaitTooLong as acquire), so the
        request leaves at a slot of its own instead of beside the next on-time ones. Its lease
        goes back first: under an in-flight cap it would hold a place the new slot waits for."""
        grants, settles = self._given_up()
        try:
            self.limiter.release_many(grants, settles=settles)
        except Exception as exc:  # the lease expires by itself
            logger.warning("limiter %r: stale lease not given back: %s", self.limiter.name, exc)
        self.grant = self.limiter.acquire(**self.accounting.acquire_options(request))

    async def renew_async(self, request: Any) -> None:
        """renew() with an AsyncLimiter."""
        grants, settles = self._given_up()
        try:
            await self.limiter.release_many(grants, settles=settles)
        except Exception as exc:
            logger.warning("limiter %r: stale lease not given back: %s", self.limiter.name, exc)
        self.grant = await self.limiter.acquire(**self.accounting.acquire_options(request))


def observe_quietly(limiter: Any, grant: Grant, status_code: int, headers: Any) -> Feedback | None:
    """observe(), but a Redis that fails now does not lose the response already in hand: the
    next acquire fails closed if it is still down."""
    try:
        return limiter.observe(grant, status_code, headers)
    except Exception as exc:
        logger.warning("limiter %r: response not fed back: %s", limiter.name, exc)
        return None


async def observe_quietly_async(
    limiter: Any, grant: Grant, status_code: int, headers: Any
) -> Feedback | None:
    try:
        return await limiter.observe(grant, status_code, headers)
    except Exception as exc:
        logger.warning("limiter %r: response not fed back: %s", limiter.name, exc)
        return None


class Limited:
    """What every adapter holds: the limiter and its Accounting, whose fields (max_wait,
    retries, cost, cost_header, cost_json_field, lease_seconds) are the keyword arguments."""

    def __init__(self, limiter: Any, **options: Any) -> None:
        self.limiter = limiter
        self.accounting = Accounting(**options)

    def send_limited(
        self,
        request: Any,
        send: Callable[[Callable[[], None]], Response],
        answer: Callable[[Response], tuple[int, Any]],
        discard: Callable[[Response], None],
        hand_over: Callable[[Response, Finish], None],
    ) -> Response:
        """A slot, then `send(fresh)`; its (status, headers) (`answer`) fed back; a throttled one
        `discard`ed and sent again while `retries` last; else it is returned, its Finish (the
        lease back, the cost settled) done now when nothing waits for the body, or arranged by
        `hand_over` for when the body is done. A grant gone stale before the request leaves
        (Grant.stale_at) is replaced by a new slot: checked before `send`, and again whenever
        `send` calls `fresh()`, which a client that can should do right before it writes the
        request, after any connection it opens for it."""
        accounting, limiter = self.accounting, self.limiter
        throttled = 0
        while True:
            grant = limiter.acquire(**accounting.acquire_options(request))
            finish = Finish(limiter, grant, accounting, {})

            def fresh(finish: Finish = finish) -> None:
                if finish.must_renew():
                    finish.renew(request)

            try:
                fresh()
                response = send(fresh)
                status, finish.headers = answer(response)
                feedback = observe_quietly(limiter, finish.grant, status, finish.headers)
                if is_throttled(status, feedback) and throttled < accounting.retries:
                    throttled += 1
                    discard(response)
                    finish()
                    continue
                if finish.now():
                    finish()
                else:
                    hand_over(response, finish)
                return response
            except BaseException:
                finish()  # nothing more comes of this request: its place is free
                raise

    async def send_limited_async(
        self,
        request: Any,
        send: Callable[[Callable[[], Awaitable[None]]], Awaitable[Response]],
        answer: Callable[[Response], tuple[int, Any]],
        discard: Callable[[Response], Awaitable[None]],
        hand_over: Callable[[Response, Finish], Awaitable[None]],
    ) -> Response:
        """send_limited with an AsyncLimiter. Here a grant goes stale easily: the event loop
        hands it over only between other coroutines' callbacks, and a burst of them (after a
        stall, or while connections are opened) holds several grants at once, whose requests
        then leave together."""
        accounting, limiter = self.accounting, self.limiter
        throttled = 0
        while True:
            grant = await limiter.acquire(**accounting.acquire_options(request))
            finish = Finish(limiter, grant, accounting, {})

            async def fresh(finish: Finish = finish) -> None:
                if finish.must_renew():
                    await finish.renew_async(request)

            try:
                await fresh()
                response = await send(fresh)
                status, finish.headers = answer(response)
                feedback = await observe_quietly_async(
                    limiter, finish.grant, status, finish.headers
                )
                if is_throttled(status, feedback) and throttled < accounting.retries:
                    throttled += 1
                    await discard(response)
                    await finish.finish_async()
                    continue
                if finish.now():
                    await finish.finish_async()
                else:
                    await hand_over(response, finish)
                return response
            except BaseException:
                await finish.finish_async()
                raise
