"""Turn HTTP response headers (Retry-After, X-RateLimit-*, IETF RateLimit) into rate-limit hints."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC
from decimal import Decimal
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import http_sf

# No hint from this module asks for more than a day. A Retry-After of years is a broken server,
# a misread date or an epoch sent where seconds belong; obeying it would freeze every worker on
# that API with nothing to show for it. After a day one request asks again and gets a fresh answer.
MAX_DELAY_SECONDS = 24 * 60 * 60.0
# A reset bigger than this is an epoch, not a count of seconds: no API counts down 31 years, and
# every epoch since 2001-09-09 is bigger. Fixed rather than relative to `now` so the reading of a
# header never depends on the caller's clock.
EPOCH_SECONDS_THRESHOLD = 1e9
# ... and bigger than this an epoch in milliseconds (as seconds it would be the year 33658).
EPOCH_MILLIS_THRESHOLD = 1e12
# Retry-After is meaningful on these. 403 is there for GitHub, which answers its secondary rate
# limits with a 403 and a Retry-After.
RETRY_AFTER_STATUSES = frozenset({403, 429, 503})

Source = Literal[
    "ratelimit",  # IETF draft-08 and later: RateLimit: "name";r=..;t=.. (+ RateLimit-Policy)
    "ratelimit-dict",  # IETF draft-07: RateLimit: limit=.., remaining=.., reset=..
    "ratelimit-fields",  # IETF drafts up to 06, GitLab: RateLimit-Limit/-Remaining/-Reset
    "x-ratelimit",  # GitHub, Discord, Reddit, ...: X-RateLimit-Limit/-Remaining/-Reset
    "x-rate-limit",  # Twitter/X and others: X-Rate-Limit-Limit/-Remaining/-Reset
]


@dataclass(frozen=True)
class QuotaHint:
    """What a response says about the quota it was counted against."""

    limit: int | None
    remaining: int | None  # never negative; an overdrawn quota reads 0
    reset_after: float | None  # seconds from now until the quota refills, 0..MAX_DELAY_SECONDS
    window: float | None  # seconds, when a policy names one
    source: Source
    policy: str | None = None  # the IETF policy name the numbers came from

    @property
    def exhausted(self) -> bool:
        return self.remaining is not None and self.remaining <= 0


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from `now` (epoch seconds): delta-seconds or an HTTP-date, capped at
    MAX_DELAY_SECONDS; None when the value is absent, garbage or negative."""
    if value is None:
        return None
    text = value.strip()
    seconds = _non_negative(text)
    if seconds is None:
        if _NUMBER.fullmatch(text):
            return None  # a negative number is not a date either
        moment = _http_date(text)
        if moment is None:
            return None
        seconds = moment - now
    return _clamp(seconds)


def parse_quota(headers: Mapping[str, str], *, now: float) -> QuotaHint | None:
    """The most restrictive quota the headers describe, whichever convention they follow.

    An epoch reset is measured against the server's `Date` when it sent one, since its reset and
    its Date come from the same clock, and against `now` otherwise."""
    fields = _normalise(headers)
    return _quota(fields, now=now, server_now=_http_date(fields.get("date")))


THROTTLE_STATUS = 429
# GitHub answers its rate limits with a 403 that carries Retry-After or a spent quota; a 403
# with neither is a real "forbidden".
HINTED_THROTTLE_STATUS = 403


def is_throttle(status: int, hint: float | None) -> bool:
    """Whether a response is the API throttling us: a 429, or a 403 with a throttle hint.
    `hint` is throttle_delay() of the response. The outcome of the call and the limiter (its
    throttle count, the metric, the adaptive rate) both decide with this."""
    return status == THROTTLE_STATUS or (status == HINTED_THROTTLE_STATUS and hint is not None)


def throttle_delay(status_code: int, headers: Mapping[str, str], *, now: float) -> float | None:
    """How long the limiter must block every worker on this API; None when the response says
    nothing about waiting.

    A throttling status with Retry-After waits for it; a spent quota with a reset in the future
    waits for the reset, on any status, which is how the limiter stops before the 429. When both
    apply the longer wins: we fail closed against someone else's quota."""
    fields = _normalise(headers)
    server_now = _http_date(fields.get("date"))
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


def _quota(fields: dict[str, str], *, now: float, server_now: float | None) -> QuotaHint | None:
    hints = [
        *_structured_hints(fields, now=now, server_now=server_now),
        *_dictionary_hints(fields, now=now, server_now=server_now),
        *_separate_field_hints(fields, now=now, server_now=server_now),
        *_prefixed_hints(fields, "x-ratelimit-", "x-ratelimit", now=now, server_now=server_now),
        *_prefixed_hints(fields, "x-rate-limit-", "x-rate-limit", now=now, server_now=server_now),
    ]
    # Fewest requests left first, then the longest wait; on a tie the newer convention (earlier
    # in the list) wins because min() keeps the first.
    return min(hints, key=_restrictiveness, default=None)


def _restrictiveness(hint: QuotaHint) -> tuple[float, float]:
    remaining = math.inf if hint.remaining is None else hint.remaining
    return remaining, -(hint.reset_after or 0.0)


def _structured_hints(
    fields: dict[str, str], *, now: float, server_now: float | None
) -> list[QuotaHint]:
    # RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400
    # RateLimit: "burst";r=0;t=30
    policies = {
        str(name): params
        for name, params in _sf(fields.get("ratelimit-policy"), "list")
        if isinstance(name, _NAME)
    }
    hints = []
    for name, params in _sf(fields.get("ratelimit"), "list"):
        if not isinstance(name, _NAME) or "r" not in params:
            continue
        policy = policies.get(str(name), {})
        hints.append(
            QuotaHint(
                limit=_sf_count(policy.get("q")),
                remaining=_sf_remaining(params.get("r")),
                reset_after=_sf_reset(params.get("t"), now=now, server_now=server_now),
                window=_sf_seconds(policy.get("w")),
                source="ratelimit",
                policy=str(name),
            )
        )
    if hints or "ratelimit" in fields:
        return hints
    # Policies alone still say what the quota is, if not how much of it is left.
    return [
        QuotaHint(
            limit=_sf_count(params.get("q")),
            remaining=None,
            reset_after=None,
            window=_sf_seconds(params.get("w")),
            source="ratelimit",
            policy=name,
        )
        for name, params in policies.items()
    ]


def _dictionary_hints(
    fields: dict[str, str], *, now: float, server_now: float | None
) -> list[QuotaHint]:
    # RateLimit: limit=100, remaining=0, reset=30
    # RateLimit-Policy: 10;w=1, 100;w=60
    members = _sf(fields.get("ratelimit"), "dictionary")
    if not members.keys() & {"limit", "remaining", "reset"}:
        return []
    limit = _sf_count(members.get("limit", (None, {}))[0])
    return [
        QuotaHint(
            limit=limit,
            remaining=_sf_remaining(members.get("remaining", (None, {}))[0]),
            reset_after=_sf_reset(
                members.get("reset", (None, {}))[0], now=now, server_now=server_now
            ),
            window=_window_for(limit, _sf(fields.get("ratelimit-policy"), "list")),
            source="ratelimit-dict",
        )
    ]


def _separate_field_hints(
    fields: dict[str, str], *, now: float, server_now: float | None
) -> list[QuotaHint]:
    # RateLimit-Limit: 100            (drafts 00-06 may add policies: "100, 100;w=60")
    # RateLimit-Remaining: 0
    # RateLimit-Reset: 30             (GitLab sends an epoch here; _reset_after tells them apart)
    limit_members = _sf(fields.get("ratelimit-limit"), "list")
    limit = _sf_count(limit_members[0][0]) if limit_members else None
    hint = QuotaHint(
        limit=limit,
        remaining=_remaining(fields.get("ratelimit-remaining")),
        reset_after=_reset(fields.get("ratelimit-reset"), now=now, server_now=server_now),
        window=_window_for(limit, [*limit_members, *_sf(fields.get("ratelimit-policy"), "list")]),
        source="ratelimit-fields",
    )
    return [hint] if _says_something(hint) else []


def _prefixed_hints(
    fields: dict[str, str], prefix: str, source: Source, *, now: float, server_now: float | None
) -> list[QuotaHint]:
    # X-RateLimit-Limit: 5000, -Remaining: 0, -Reset: 1372700873 (GitHub, an epoch)
    # X-RateLimit-Reset-After: 1.234 (Discord: relative, so no clock to disagree about; preferred)
    reset_after = _non_negative(fields.get(prefix + "reset-after"))
    if reset_after is None:
        reset_after = _reset(fields.get(prefix + "reset"), now=now, server_now=server_now)
    else:
        reset_after = _clamp(reset_after)
    hint = QuotaHint(
        limit=_count(fields.get(prefix + "limit")),
        remaining=_remaining(fields.get(prefix + "remaining")),
        reset_after=reset_after,
        window=None,
        source=source,
    )
    return [hint] if _says_something(hint) else []


def _says_something(hint: QuotaHint) -> bool:
    return any(v is not None for v in (hint.limit, hint.remaining, hint.reset_after))


def _window_for(limit: int | None, policies: Iterable[_Member]) -> float | None:
    """The window of the integer policy item whose quota is `limit` ("100;w=60")."""
    for quota, params in policies:
        if limit is not None and _sf_count(quota) == limit and "w" in params:
            return _sf_seconds(params["w"])
    return None


# --- Plain header values ---------------------------------------------------------------------

_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?", re.ASCII)


def _number(value: str | None) -> float | None:
    if value is None or not _NUMBER.fullmatch(text := value.strip()):
        return None
    number = float(text)
    return number if math.isfinite(number) else None


def _non_negative(value: str | None) -> float | None:
    number = _number(value)
    return None if number is None or number < 0 else number


def _count(value: str | None) -> int | None:
    number = _non_negative(value)
    return None if number is None else int(number)


def _remaining(value: str | None) -> int | None:
    # Reddit sends "598.0"; round down, a fraction of a request cannot be sent. Below zero is an
    # overdrawn quota, which for us is the same as a spent one.
    number = _number(value)
    return None if number is None else max(0, math.floor(number))


def _reset(value: str | None, *, now: float, server_now: float | None) -> float | None:
    number = _non_negative(value)
    if number is not None:
        return _reset_after(number, now=now, server_now=server_now)
    moment = _http_date(value)  # a few servers send the reset as an HTTP-date
    if moment is None:
        return None
    return _clamp(moment - (now if server_now is None else server_now))


def _reset_after(value: float, *, now: float, server_now: float | None) -> float:
    """Seconds until a reset given as delta-seconds, epoch seconds or epoch milliseconds."""
    if value > EPOCH_MILLIS_THRESHOLD:
        value /= 1000
    if value > EPOCH_SECONDS_THRESHOLD:
        # Server and client clocks differ; the server's reset is on the server's clock.
        value -= now if server_now is None else server_now
    return _clamp(value)


def _clamp(seconds: float) -> float:
    return min(max(seconds, 0.0), MAX_DELAY_SECONDS)


def _http_date(value: str | None) -> float | None:
    """Epoch seconds of an IMF-fixdate, RFC 850 or asctime date."""
    if not value:
        return None
    try:
        moment = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment.tzinfo is None:  # asctime carries no zone; HTTP dates are always GMT
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _normalise(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased names, for plain dicts, requests' CaseInsensitiveDict, httpx and the like."""
    fields: dict[str, str] = {}
    for name, value in headers.items():
        key = str(name).lower()
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        if key in fields and key in _LIST_FIELDS:
            # aiohttp and http.client yield repeated fields separately; list fields combine.
            fields[key] = f"{fields[key]}, {text}"
        else:
            fields[key] = text
    return fields


_LIST_FIELDS = frozenset({"ratelimit", "ratelimit-policy", "ratelimit-limit"})


# --- Structured fields (RFC 9651), parsed by http-sf -----------------------------------------

_Member = tuple[Any, dict[str, Any]]  # (bare item or inner list, parameters)
_NAME = (str, http_sf.Token)  # a policy name is an sf-string, or an sf-token from lax servers


def _sf(value: str | None, tltype: Literal["list", "dictionary"]) -> Any:
    """The members of a structured field; none when it is absent or does not parse (the RFC
    discards a field that fails to parse as a whole, and one with non-ASCII in it cannot)."""
    try:
        return http_sf.parse((value or "").strip(" \t").encode("ascii"), tltype=tltype)
    except ValueError:  # http_sf.StructuredFieldError or UnicodeEncodeError
        return [] if tltype == "list" else {}


def _sf_number(value: object) -> float | None:
    # bool is an int to Python, but ?1 is not a count of anything. Decimals arrive as Decimal.
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        return None
    return float(value)


def _sf_count(value: object) -> int | None:
    number = _sf_number(value)
    return None if number is None or number < 0 else int(number)


def _sf_remaining(value: object) -> int | None:
    number = _sf_number(value)
    return None if number is None else max(0, math.floor(number))


def _sf_seconds(value: object) -> float | None:
    number = _sf_number(value)
    return None if number is None or number < 0 else number


def _sf_reset(value: object, *, now: float, server_now: float | None) -> float | None:
    seconds = _sf_seconds(value)
    return None if seconds is None else _reset_after(seconds, now=now, server_now=server_now)
