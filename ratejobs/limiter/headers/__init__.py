"""Turn HTTP response headers (Retry-After, X-RateLimit-*, IETF RateLimit and the dialects of
OpenAI, Anthropic, Shopify, HubSpot, Salesforce and Discord) into rate-limit hints.

This module is the public face and combines the families: of all the quotas a response
describes, the most restrictive one is the hint. Each family is read in a file of its own:

- values.py: one header value: Retry-After, numbers, counts, resets (delta-seconds, epochs,
  Go durations, HTTP-dates, ISO 8601) and the limits on them (MAX_DELAY_SECONDS, MAX_DIGITS).
- hints.py: QuotaHint, what a response says about a quota, and Source, the family that said it.
- ietf.py: the IETF RateLimit fields: RateLimit and RateLimit-Policy as structured fields
  (draft-08 and later) or a dictionary (draft-07), and RateLimit-Limit/-Remaining/-Reset.
- vendors.py: X-RateLimit-* and X-Rate-Limit-* (GitHub, Twitter/X, Discord, ...), OpenAI's and
  Anthropic's per-dimension fields, Shopify, HubSpot and Salesforce.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ratejobs.limiter.headers.hints import QuotaHint, Source
from ratejobs.limiter.headers.ietf import dictionary_hints, separate_field_hints, structured_hints
from ratejobs.limiter.headers.values import (
    MAX_DELAY_SECONDS,
    MAX_DIGITS,
    UNKNOWN_RESET_PROBE_SECONDS,
    http_date,
    normalise,
    parse_retry_after,
)
from ratejobs.limiter.headers.vendors import (
    dimension_hints,
    hubspot_hints,
    prefixed_hints,
    salesforce_hints,
    shopify_hints,
)

__all__ = [
    "MAX_DELAY_SECONDS",
    "MAX_DIGITS",
    "UNKNOWN_RESET_PROBE_SECONDS",
    "QuotaHint",
    "Source",
    "is_throttle",
    "parse_quota",
    "parse_retry_after",
    "throttle_delay",
]

# Retry-After is meaningful on these. 403 is there for GitHub, which answers its secondary rate
# limits with a 403 and a Retry-After.
RETRY_AFTER_STATUSES = frozenset({403, 429, 503})
THROTTLE_STATUS = 429
# GitHub answers its rate limits with a 403 that carries Retry-After or a spent quota; a 403
# with neither is a real "forbidden".
HINTED_THROTTLE_STATUS = 403
# Every field name a family reads is one of these or contains a mark. Most responses carry
# none, and reading their Date and asking each family cost about 3 % of a worker's CPU per
# call (py-spy, bench-jobs): a response without one says nothing, at once.
_HINT_FIELDS = frozenset({"retry-after", "x-shopify-shop-api-call-limit", "sforce-limit-info"})
_HINT_MARKS = ("ratelimit", "rate-limit")


def parse_quota(headers: Mapping[str, str], *, now: float | None) -> QuotaHint | None:
    """The most restrictive quota the headers describe, whichever convention they follow.

    An epoch reset is measured against the server's `Date` when it sent one, since its reset and
    its Date come from the same clock, and against `now` otherwise (see throttle_delay)."""
    fields = normalise(headers)
    if not _may_hint(fields):
        return None
    return _quota(fields, now=now, server_now=http_date(fields.get("date")))


def is_throttle(status: int, hint: float | None) -> bool:
    """Whether a response is the API throttling us: a 429, or a 403 with a throttle hint.
    `hint` is throttle_delay() of the response. The outcome of the call and the limiter (its
    throttle count, the metric, the adaptive rate) both decide with this."""
    return status == THROTTLE_STATUS or (status == HINTED_THROTTLE_STATUS and hint is not None)


def throttle_delay(
    status_code: int, headers: Mapping[str, str], *, now: float | None
) -> float | None:
    """How long the limiter must block every worker on this API; None when the response says
    nothing about waiting.

    A throttling status with Retry-After waits for it; a spent quota with a reset in the future
    waits for the reset, on any status, which is how the limiter stops before the 429. When both
    apply the longer wins: we fail closed against someone else's quota.

    A reset given as a moment (an epoch, an HTTP-date, an ISO 8601 date-time) is read against
    the response's `Date`, and without one against `now`: the limiter's clock (Redis TIME),
    which every worker shares. A worker's own clock may be off by seconds or minutes, and a
    block measured on a fast one would end early. None for `now`: such a reset is not read."""
    fields = normalise(headers)
    if not _may_hint(fields):
        return None
    server_now = http_date(fields.get("date"))
    delays = []
    if status_code in RETRY_AFTER_STATUSES:
        # Delta-seconds ignore the reference; an HTTP-date is read on the server's clock.
        reference = now if server_now is None else server_now
        retry_after = parse_retry_after(fields.get("retry-after"), now=reference)
        if retry_after is not None:
            delays.append(retry_after)
    hint = _quota(fields, now=now, server_now=server_now)
    if hint is not None and hint.exhausted and hint.reset_after:
        delays.append(hint.reset_after)
    return max(delays) if delays else None


def is_hint_field(name: str) -> bool:
    """Whether a response header (by lower-case name) is one the throttle hints are read from:
    Retry-After and the rate-limit fields of every dialect."""
    return name in _HINT_FIELDS or any(mark in name for mark in _HINT_MARKS)


def _may_hint(fields: dict[str, str]) -> bool:
    return any(is_hint_field(name) for name in fields)


def _quota(
    fields: dict[str, str], *, now: float | None, server_now: float | None
) -> QuotaHint | None:
    hints = [
        *structured_hints(fields, now=now, server_now=server_now),
        *dictionary_hints(fields, now=now, server_now=server_now),
        *separate_field_hints(fields, now=now, server_now=server_now),
        *dimension_hints(fields, "openai", now=now, server_now=server_now),
        *dimension_hints(fields, "anthropic", now=now, server_now=server_now),
        *shopify_hints(fields),
        *hubspot_hints(fields),
        *salesforce_hints(fields),
        *prefixed_hints(fields, "x-ratelimit-", "x-ratelimit", now=now, server_now=server_now),
        *prefixed_hints(fields, "x-rate-limit-", "x-rate-limit", now=now, server_now=server_now),
    ]
    # Fewest requests left first, then the longest wait; on a tie the newer convention (earlier
    # in the list) wins because min() keeps the first.
    return min(hints, key=_restrictiveness, default=None)


def _restrictiveness(hint: QuotaHint) -> tuple[float, float]:
    remaining = math.inf if hint.remaining is None else hint.remaining
    return remaining, -(hint.reset_after or 0.0)
