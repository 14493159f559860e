"""What to do after one attempt: done, give up, retry after a backoff, or wait out a throttle.

Counting: `attempts` is the number of this attempt (1-based) among those that use up
max_attempts; a throttled attempt does not use one. `throttled_retries` is how many retries
after a throttle were already granted, this attempt not included.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal

from ratejobs.execution.backoff import full_jitter
from ratejobs.execution.http import HttpResult
from ratejobs.limiter.headers import is_throttle, throttle_delay

# "wait" is never a classification: attempt_call uses it when nothing could be sent.
DecisionKind = Literal["succeeded", "failed", "retry", "throttled", "wait"]

# Request Timeout: the server gave up waiting for us, so a later attempt can succeed.
RETRYABLE_4XX = frozenset({408})
# An unexpected error's text goes into the call's record and the logs: its first line's worth.
MAX_UNEXPECTED_CHARS = 300


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    retry_after: float = 0.0  # seconds; for "retry", "throttled" and "wait"
    error: str = ""  # why it failed, or why it is retried
    throttle: bool = False  # the API throttled this attempt (kind "throttled", or "failed"
    # once max_throttled_retries were used)

    @property
    def counts_as_attempt(self) -> bool:
        """Whether this attempt used up one of max_attempts (throttles and waits do not)."""
        return self.kind != "wait" and not self.throttle


def classify(
    result: HttpResult,
    *,
    attempts: int,
    max_attempts: int,
    throttled_retries: int,
    max_throttled_retries: int,
    backoff_base: float,
    backoff_cap: float,
    rng: random.Random | None = None,
    now: float | None = None,
    retry_conflicts: bool = False,
) -> Decision:
    """2xx and 3xx (a redirect we would not follow) succeed; 429 (and a 403 with a throttle
    hint) is throttled, retried after the hint or a backoff without using up max_attempts;
    5xx, 408 (and 409 with retry_conflicts: an idempotency key still in use) and network
    errors are retried while attempts < max_attempts; other 4xx fail, and so does an address
    the outbound policy refused, at once. `now` is the limiter's clock (Limiter.clock()), on
    which a reset given as a moment is read when the response has no Date (throttle_delay)."""
    status = result.status_code

    def backoff(retries: int) -> float:
        return full_jitter(max(retries, 0), base=backoff_base, cap=backoff_cap, rng=rng)

    def retry_or_fail(reason: str, hint: float | None) -> Decision:
        return _retry_or_fail(reason, hint, attempts=attempts, max_attempts=max_attempts,
                              backoff=backoff)  # fmt: skip

    if result.error_kind == "refused":
        # Configuration, not a network hiccup: every retry would be refused the same way, and
        # only hammer the policy (and whoever is probing it) on the way.
        return Decision("failed", error=result.error)
    if result.error_kind is not None or status is None:
        return retry_or_fail(result.error or "no response", None)
    hint = throttle_delay(status, result.headers, now=now)
    if is_throttle(status, hint):
        if throttled_retries >= max_throttled_retries:
            return Decision(
                "failed",
                error=f"still throttled ({_status_text(status)}) after {throttled_retries} "
                "retries, the most allowed",
                throttle=True,
            )
        delay = hint if hint is not None else backoff(throttled_retries)
        return Decision("throttled", retry_after=delay, error=_status_text(status), throttle=True)
    if 200 <= status < 400:
        return Decision("succeeded")
    if status >= 500 or status in RETRYABLE_4XX or (status == 409 and retry_conflicts):
        return retry_or_fail(_status_text(status), hint)
    return Decision("failed", error=_status_text(status))


def classify_unexpected(
    exc: Exception,
    *,
    attempts: int,
    max_attempts: int,
    backoff_base: float,
    backoff_cap: float,
    rng: random.Random | None = None,
) -> Decision:
    """An attempt that ended in an error nobody planned for: a Redis error the limiter cannot
    place (READONLY after a failover, OOM), a time limit in the middle of a request, a bug. It
    uses up an attempt and is retried after a backoff while attempts remain, then fails, with
    its error: never a loop that leaves no trace. A ValueError is the HTTP client refusing the
    request itself (an odd URL): every retry would fail the same way, so it fails at once."""
    reason = f"unexpected {type(exc).__name__}: {str(exc)[:MAX_UNEXPECTED_CHARS]}".rstrip(": ")
    if isinstance(exc, ValueError):
        return Decision("failed", error=reason)

    def backoff(retries: int) -> float:
        return full_jitter(max(retries, 0), base=backoff_base, cap=backoff_cap, rng=rng)

    return _retry_or_fail(reason, None, attempts=attempts, max_attempts=max_attempts,
                          backoff=backoff)  # fmt: skip


def _retry_or_fail(
    reason: str,
    hint: float | None,
    *,
    attempts: int,
    max_attempts: int,
    backoff: Callable[[int], float],
) -> Decision:
    if attempts < max_attempts:
        delay = hint if hint is not None else backoff(attempts - 1)
        return Decision("retry", retry_after=delay, error=reason)
    return Decision("failed", error=f"gave up after {attempts} attempts: {reason}")


def _status_text(status: int) -> str:
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"
