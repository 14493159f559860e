"""One attempt at one call: a slot from the shared limiter, the request, the response fed back
to the limiter, the lease returned, and a decision on what comes next."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, replace

import requests

from ratejobs.execution.backoff import backoff_ceiling
from ratejobs.execution.http import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_READ_TIMEOUT,
    HttpResult,
    send,
)
from ratejobs.execution.outcome import Decision, DecisionKind, classify, classify_unexpected
from ratejobs.execution.request import HttpRequest
from ratejobs.execution.targets import redact_url
from ratejobs.limiter import (
    Feedback,
    Grant,
    Limiter,
    LimiterError,
    LimiterUnavailable,
    TooBig,
    WaitTooLong,
)
from ratejobs.limiter.config import is_positive_number
from ratejobs.limiter.cost import cost_from_response

logger = logging.getLogger(__name__)

OutcomeKind = DecisionKind

# The whole exchange, redirects and body included; a trickling server that stays just inside
# the read timeout on every read would otherwise hold the worker and its lease for ever.
DEFAULT_TOTAL_TIMEOUT = 60.0
# Five attempts with a 1 s base wait up to 1+2+4+8 s between them: enough to ride out a deploy
# or a failover, few enough that a broken endpoint fails within a minute.
DEFAULT_MAX_ATTEMPTS = 5
# Each throttle is waited out as the API asks, so these retries are cheap for the API; a call
# still throttled after this many is stuck behind a quota that is not refilling.
DEFAULT_MAX_THROTTLED_RETRIES = 20
DEFAULT_BACKOFF_BASE = 1.0
# No backoff beyond a minute: past that a retry is better scheduled by the caller than slept on.
DEFAULT_BACKOFF_CAP = 60.0
# Redis unreachable is usually a restart or a failover that takes seconds; nothing was sent, so
# a short fixed wait costs the API nothing.
LIMITER_UNAVAILABLE_RETRY_SECONDS = 5.0
# A lease must outlive the request it covers. send() ends at its total timeout but for the DNS
# lookups of its connections, which no socket timeout bounds: the connect and read timeouts
# added to the lease cover those, and this much more the Redis round trips around it.
LEASE_MARGIN_SECONDS = 5.0


@dataclass(frozen=True)
class ExecutionPolicy:
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    total_timeout: float = DEFAULT_TOTAL_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_throttled_retries: int = DEFAULT_MAX_THROTTLED_RETRIES
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_cap: float = DEFAULT_BACKOFF_CAP
    # Requests carry an idempotency key: a 409 is the API still answering an earlier attempt
    # with the same key (Stripe's "idempotency key in use"), to be retried, not a failure.
    retry_conflicts: bool = False
    # Where a response says what the call really cost (cost.cost_from_response): the limiter
    # is settled to that, so a cost window holds to what the API counted, not to estimates.
    cost_header: str = ""
    cost_json_field: str = ""

    def __post_init__(self) -> None:
        errors = []
        for name in ("connect_timeout", "read_timeout", "total_timeout", "backoff_base"):
            if not is_positive_number(getattr(self, name)):
                errors.append(f"{name} must be a positive number of seconds")
        if not is_positive_number(self.backoff_cap) or self.backoff_cap < self.backoff_base:
            errors.append("backoff_cap must be a number of seconds >= backoff_base")
        if not _whole(self.max_body_bytes, 0):
            errors.append("max_body_bytes must be a whole number >= 0")
        if not _whole(self.max_attempts, 1):
            errors.append("max_attempts must be a whole number >= 1")
        if not _whole(self.max_throttled_retries, 0):
            errors.append("max_throttled_retries must be a whole number >= 0")
        if errors:
            raise ValueError("; ".join(errors))

    @property
    def lease_seconds(self) -> float:
        """How long an in-flight lease lasts: the longest send() can take, and a margin."""
        return self.total_timeout + self.connect_timeout + self.read_timeout + LEASE_MARGIN_SECONDS


@dataclass(frozen=True)
class Outcome:
    """One attempt's end. `attempts` and `throttled_retries` are the counters to pass to the
    next attempt's attempt_call (as `attempts + 1` and `throttled_retries`)."""

    decision: Decision
    result: HttpResult | None  # None: nothing was sent
    feedback: Feedback | None  # what the response did to the shared limiter, if anything
    slot_us: int | None  # the limiter slot granted (Redis clock), None if none was
    generation: int | None
    waited: float  # seconds spent waiting for the limiter
    attempts: int
    throttled_retries: int
    limiter_error: str = ""  # the response could not be fed back (or the lease returned)
    # The lease, when the caller asked to return it itself (return_lease=False), and with it
    # the settle of cost_used (release_many's settles); None once returned, or when nothing
    # was granted.
    lease: Grant | None = None
    # What the response said the call cost (cost_header / cost_json_field); None: not said.
    cost_used: int | None = None
    # A slot further away than max_wait, reserved for this call (keep_place): hand it back to
    # attempt_call as `reserved` when the call runs again, max_wait before it (retry_after).
    place: Grant | None = None

    @property
    def kind(self) -> OutcomeKind:
        return self.decision.kind

    @property
    def retry_after(self) -> float:
        return self.decision.retry_after

    @property
    def error(self) -> str:
        return self.decision.error

    @property
    def sent(self) -> bool:
        return self.result is not None


def attempt_call(
    request: HttpRequest,
    *,
    limiter: Limiter,
    session: requests.Session,
    policy: ExecutionPolicy,
    attempts: int,
    throttled_retries: int,
    max_wait: float,
    weight: int = 1,
    rng: random.Random | None = None,
    return_lease: bool = True,
    reserved: Grant | None = None,
    cost: int = 0,
    keep_place: bool = False,
) -> Outcome:
    """Run attempt number `attempts` (1-based, throttled attempts not counted) of a call.

    Waits at most `max_wait` seconds for a limiter slot; a slot further away, or a limiter that
    cannot be reached, gives kind "wait" and nothing is sent. The response's status and headers
    go to limiter.observe(), so a 429 or a spent quota blocks every worker on this API and cuts
    the adaptive rate once per burst. The lease is returned whatever happens, or with
    return_lease=False handed back in Outcome.lease for the caller to return (several in one
    round trip: only where no in-flight cap waits on it). Any other error
    (a Redis error the limiter cannot place, a request the HTTP client refuses, a time limit
    mid-request) ends the attempt as an Outcome too, with its error (classify_unexpected).
    `reserved` is a slot acquire_many reserved for this call: it is confirmed (at no round
    trip when its time has come) instead of acquiring one.
    `cost` is what the call is expected to cost in the limiter's cost windows (reserved slots
    carry the cost they were reserved with); when the response reports another (the policy's
    cost_header or cost_json_field), Outcome.cost_used says it and the limiter is settled to it
    as the lease goes back: here, or by the caller that returns the lease (release_many's
    settles, one round trip for a batch).
    With `keep_place`, a slot beyond max_wait is reserved all the same when the limiter keeps
    the place (a large cost would otherwise wait for ever behind smaller ones): kind "wait",
    the reservation in Outcome.place, retry_after max_wait before its slot. A cost (or weight)
    larger than a window's burst fails at once: no wait makes room for it.
    """
    if not (isinstance(max_wait, int | float) and max_wait >= 0):
        raise ValueError("max_wait must be a number of seconds >= 0")
    try:
        return _attempt(
            request, limiter=limiter, session=session, policy=policy, attempts=attempts,
            throttled_retries=throttled_retries, max_wait=max_wait, weight=weight, rng=rng,
            return_lease=return_lease, reserved=reserved, cost=cost, keep_place=keep_place,
        )  # fmt: skip
    except Exception as exc:  # every error must end as a recorded attempt, never a loop
        decision = classify_unexpected(
            exc,
            attempts=attempts,
            max_attempts=policy.max_attempts,
            backoff_base=policy.backoff_base,
            backoff_cap=policy.backoff_cap,
            rng=rng,
        )
        logger.warning("limiter %r, %s: %s", limiter.name, redact_url(request.url), decision.error)
        return outcome_without_response(decision, 0.0, attempts, throttled_retries)


def _attempt(
    request: HttpRequest,
    *,
    limiter: Limiter,
    session: requests.Session,
    policy: ExecutionPolicy,
    attempts: int,
    throttled_retries: int,
    max_wait: float,
    weight: int,
    rng: random.Random | None,
    return_lease: bool,
    reserved: Grant | None,
    cost: int,
    keep_place: bool,
) -> Outcome:
    started = time.monotonic()
    try:
        if reserved is not None:
            grant = limiter.confirm(reserved, max_wait=max_wait, keep_place=keep_place)
        else:
            grant = limiter.acquire(
                weight,
                cost=cost,
                max_wait=max_wait,
                lease_seconds=policy.lease_seconds,
                keep_place=keep_place,
            )
    except TooBig as exc:
        decision = Decision("failed", error=f"can never be sent, whatever the wait: {exc}")
        return outcome_without_response(
            decision, time.monotonic() - started, attempts, throttled_retries
        )
    except WaitTooLong as exc:
        if exc.place is not None:
            # Back max_wait before the slot, so that the next attempt is there to confirm it
            # whatever the way back through the database and the broker takes.
            decision = Decision(
                "wait",
                retry_after=max(0.0, exc.retry_after - max_wait),
                error=f"next slot of limiter {limiter.name!r} is {exc.retry_after:.3f}s away, "
                f"beyond max_wait {max_wait}s; its place is kept, nothing sent yet",
            )
            outcome = outcome_without_response(
                decision, time.monotonic() - started, attempts, throttled_retries
            )
            return replace(outcome, place=exc.place)
        if exc.at_capacity:
            # Due again at once: the dispatcher sends it back when a place is free (it keeps
            # a capped API's calls in the broker within its cap), never at a lease's expiry.
            decision = Decision(
                "wait",
                retry_after=0.0,
                error=f"every in-flight place of limiter {limiter.name!r} stayed taken for "
                f"max_wait {max_wait}s; nothing sent",
            )
        else:
            decision = slot_too_far(limiter.name, exc.retry_after, max_wait)
        return outcome_without_response(
            decision, time.monotonic() - started, attempts, throttled_retries
        )
    except LimiterUnavailable as exc:
        decision = Decision(
            "wait",
            retry_after=LIMITER_UNAVAILABLE_RETRY_SECONDS,
            error=f"limiter unavailable, nothing sent (fails closed): {exc}",
        )
        return outcome_without_response(
            decision, time.monotonic() - started, attempts, throttled_retries
        )

    feedback: Feedback | None = None
    # The limiter's clock, for the retry delay of a reset given as a moment: a worker's own
    # clock may be off, and the call would come back before the block it is told to wait out.
    now: float | None = None
    limiter_error = ""
    cost_used: int | None = None
    handed_back = False
    try:
        result = send(
            session,
            request,
            connect_timeout=policy.connect_timeout,
            read_timeout=policy.read_timeout,
            max_body_bytes=policy.max_body_bytes,
            total_timeout=policy.total_timeout,
        )
        if result.status_code is not None:
            # A 429 without hints blocks everyone for this call's un-jittered backoff: the
            # jitter spreads one caller's retries, but a block is shared and one random
            # draw near zero would let every worker straight back in.
            default_block = backoff_ceiling(
                throttled_retries, base=policy.backoff_base, cap=policy.backoff_cap
            )
            try:
                feedback = limiter.observe(
                    grant, result.status_code, result.headers, default_block=default_block
                )
                now = limiter.clock()  # read by observe just now: no round trip
            except LimiterError as exc:
                limiter_error = f"response not fed back to the limiter: {exc}"
                logger.warning("%s (%s)", limiter_error, redact_url(request.url))
            cost_used = _cost_used(result, policy)
        handed_back = not return_lease
    finally:
        # after an error the lease goes back here, whatever the caller asked; the real cost is
        # settled in the same round trip (or by the caller, with the lease it returns)
        if not handed_back:
            limiter_error = _return_lease(limiter, grant, cost_used) or limiter_error

    decision = classify(
        result,
        attempts=attempts,
        max_attempts=policy.max_attempts,
        throttled_retries=throttled_retries,
        max_throttled_retries=policy.max_throttled_retries,
        backoff_base=policy.backoff_base,
        backoff_cap=policy.backoff_cap,
        rng=rng,
        now=now,
        retry_conflicts=policy.retry_conflicts,
    )
    logger.debug(
        "%s %s: %s (%s) in %.3fs",
        request.method,
        redact_url(request.url),
        decision.kind,
        result.status_code if result.error_kind is None else result.error_kind,
        result.duration,
    )
    return Outcome(
        decision=decision,
        result=result,
        feedback=feedback,
        slot_us=grant.slot_us,
        generation=grant.generation,
        waited=grant.waited,
        attempts=_attempts_used(decision, attempts),
        throttled_retries=throttled_retries + (decision.kind == "throttled"),
        limiter_error=limiter_error,
        lease=grant if handed_back else None,
        cost_used=cost_used,
    )


def _cost_used(result: HttpResult, policy: ExecutionPolicy) -> int | None:
    """What the response says the call cost (the policy's cost_header or cost_json_field)."""
    if not (policy.cost_header or policy.cost_json_field):
        return None
    return cost_from_response(
        result.headers, result.body, header=policy.cost_header, json_field=policy.cost_json_field
    )


def _return_lease(limiter: Limiter, grant: Grant, cost_used: int | None) -> str:
    """Return the grant's lease and settle its real cost in one round trip; the error to
    record, if any. A lease not returned expires by itself after lease_seconds; a cost not
    settled leaves the next grants on the estimate."""
    settles = [] if cost_used is None else [(grant, cost_used)]
    try:
        limiter.release_many([grant], settles=settles)
    except (LimiterError, ValueError) as exc:
        settled = f" and actual cost {cost_used} not settled" if settles else ""
        logger.warning("limiter %r: lease not returned%s: %s", limiter.name, settled, exc)
        return f"lease not returned{settled}: {exc}"
    return ""


def slot_too_far(limiter_name: str, slot_in: float, max_wait: float) -> Decision:
    """A call whose next slot is `slot_in` seconds away, beyond max_wait: nothing sent, due
    again when that slot would come."""
    return Decision(
        "wait",
        retry_after=slot_in,
        error=f"next slot of limiter {limiter_name!r} is {slot_in:.3f}s away, "
        f"beyond max_wait {max_wait}s; nothing sent",
    )


def outcome_without_response(
    decision: Decision, waited: float, attempts: int, throttled_retries: int
) -> Outcome:
    """An attempt that ended with no response to show: nothing was sent (kind "wait", or a
    request that could not be built), or an unexpected error ended it."""
    return Outcome(
        decision=decision,
        result=None,
        feedback=None,
        slot_us=None,
        generation=None,
        waited=waited,
        attempts=_attempts_used(decision, attempts),
        throttled_retries=throttled_retries,
    )


def _attempts_used(decision: Decision, attempts: int) -> int:
    return attempts if decision.counts_as_attempt else attempts - 1


def _whole(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
