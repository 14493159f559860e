"""Turn HTTP response headers (Retry-After, X-RateLimit-*, IETF RateLimit and the dialects of
OpenAI, Anthropic, Shopify, HubSpot, Salesforce and Discord) into rate-limit hints."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
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
# Shopify's REST Admin API leaks 2 requests/s on its standard plan (4, 20 and 40 on larger ones).
# Its header gives the bucket's fill, not the plan, so a full bucket waits for the slowest leak:
# on a faster plan that waits a little longer than needed, never too little.
SHOPIFY_LEAK_PER_SECOND = 2.0
# A spent quota whose headers never say when it refills: HubSpot's daily limit (midnight in the
# account's own time zone, which no header gives) and Salesforce's daily API requests (a rolling
# 24 h). One request asks again after this long: a wrong guess costs one refused request an hour,
# or at most an hour of quota left unused, where a day's block could waste most of a day.
UNKNOWN_RESET_PROBE_SECONDS = 60 * 60.0
DAY_SECONDS = 24 * 60 * 60.0
# The longest run of digits read as a number: 20 digits hold any 64-bit count, and an epoch in
# microseconds takes 16. A longer run is no count an API keeps but garbage or an attack, ignored
# like any other garbage: read, it would overflow a float or make int() raise (Python refuses
# more than 4300 digits), and fail the call whose response carried it.
MAX_DIGITS = 20
# A run of at most MAX_DIGITS digits that is not the start of a longer one.
_DIGITS = rf"[0-9]{{1,{MAX_DIGITS}}}(?![0-9])"

Source = Literal[
    "ratelimit",  # IETF draft-08 and later: RateLimit: "name";r=..;t=.. (+ RateLimit-Policy)
    "ratelimit-dict",  # IETF draft-07: RateLimit: limit=.., remaining=.., reset=..
    "ratelimit-fields",  # IETF drafts up to 06, GitLab: RateLimit-Limit/-Remaining/-Reset
    "x-ratelimit",  # GitHub, Discord, Reddit, ...: X-RateLimit-Limit/-Remaining/-Reset
    "x-rate-limit",  # Twitter/X and others: X-Rate-Limit-Limit/-Remaining/-Reset
    "discord",  # X-RateLimit-* plus -Reset-After, -Bucket, -Scope and -Global
    "openai",  # x-ratelimit-{limit,remaining,reset}-{requests,tokens}; resets as "6m0s"
    "anthropic",  # anthropic-ratelimit-{requests,tokens,...}-{limit,remaining,reset}; RFC 3339
    "shopify",  # X-Shopify-Shop-Api-Call-Limit: 39/40, a leaky bucket
    "hubspot",  # X-HubSpot-RateLimit-{Daily,Max,Secondly,...}
    "salesforce",  # Sforce-Limit-Info: api-usage=25/15000, a daily quota
]


@dataclass(frozen=True)
class QuotaHint:
    """What a response says about the quota it was counted against."""

    limit: int | None
    remaining: int | None  # never negative; an overdrawn quota reads 0
    # Seconds from now until the quota refills, 0..MAX_DELAY_SECONDS: for a leaky bucket until
    # it takes one more request, for a spent quota that never says when UNKNOWN_RESET_PROBE_SECONDS.
    reset_after: float | None
    window: float | None  # seconds, when a policy names one
    source: Source
    # What the numbers count: the IETF policy's name, a dimension ("requests", "tokens",
    # "input-tokens", "daily", "api-usage") or Discord's scope ("user", "shared", "global").
    policy: str | None = None

    @property
    def exhausted(self) -> bool:
        return self.remaining is not None and self.remaining <= 0


def parse_retry_after(value: str | None, *, now: float | None) -> float | None:
    """Seconds to wait from `now` (epoch seconds): delta-seconds or an HTTP-date, capped at
    MAX_DELAY_SECONDS; None when the value is absent, garbage or negative, or a date with no
    `now` to read it against."""
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
        return _seconds_until(moment, now=now, server_now=None)
    return _clamp(seconds)


def parse_quota(headers: Mapping[str, str], *, now: float | None) -> QuotaHint | None:
    """The most restrictive quota the headers describe, whichever convention they follow.

    An epoch reset is measured against the server's `Date` when it sent one, since its reset and
    its Date come from the same clock, and against `now` otherwise (see throttle_delay)."""
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


def _quota(
    fields: dict[str, str], *, now: float | None, server_now: float | None
) -> QuotaHint | None:
    hints = [
        *_structured_hints(fields, now=now, server_now=server_now),
        *_dictionary_hints(fields, now=now, server_now=server_now),
        *_separate_field_hints(fields, now=now, server_now=server_now),
        *_dimension_hints(fields, "openai", now=now, server_now=server_now),
        *_dimension_hints(fields, "anthropic", now=now, server_now=server_now),
        *_shopify_hints(fields),
        *_hubspot_hints(fields),
        *_salesforce_hints(fields),
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
    fields: dict[str, str], *, now: float | None, server_now: float | None
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
    fields: dict[str, str], *, now: float | None, server_now: float | None
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
    fields: dict[str, str], *, now: float | None, server_now: float | None
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
    fields: dict[str, str],
    prefix: str,
    source: Source,
    *,
    now: float | None,
    server_now: float | None,
) -> list[QuotaHint]:
    # X-RateLimit-Limit: 5000, -Remaining: 0, -Reset: 1372700873 (GitHub, an epoch)
    # X-RateLimit-Reset-After: 1.234 (Discord: relative, so no clock to disagree about; preferred)
    # X-RateLimit-Reset as ISO 8601: Mastodon's has milliseconds or more and Z, Jira's is
    # yyyy-MM-ddTHH:mmZ (no seconds)
    reset_after = _non_negative(fields.get(prefix + "reset-after"))
    if reset_after is None:
        reset_after = _reset(fields.get(prefix + "reset"), now=now, server_now=server_now)
    else:
        reset_after = _clamp(reset_after)
    policy = None
    if source == "x-ratelimit" and any(name in fields for name in _DISCORD_FIELDS):
        # Discord's limits are per route, per resource ("shared") or global; ours is one per API,
        # so whichever scope is spent blocks every call to the API, which fails closed.
        source = "discord"
        is_global = fields.get("x-ratelimit-global", "").strip().lower() == "true"
        policy = "global" if is_global else (fields.get("x-ratelimit-scope") or "").strip() or None
    hint = QuotaHint(
        limit=_count(fields.get(prefix + "limit")),
        remaining=_remaining(fields.get(prefix + "remaining")),
        reset_after=reset_after,
        window=None,
        source=source,
        policy=policy,
    )
    return [hint] if _says_something(hint) else []


_DISCORD_FIELDS = frozenset(
    {"x-ratelimit-reset-after", "x-ratelimit-bucket", "x-ratelimit-scope", "x-ratelimit-global"}
)
# Each family's prefix (a cheap test first: every response has a dozen fields that are neither)
# and the field names that carry a dimension:
_DIMENSION_FIELDS: dict[Source, tuple[str, re.Pattern[str]]] = {
    # x-ratelimit-remaining-tokens (OpenAI; Groq and others copy it), and the dimensions OpenAI
    # adds (tokens_usage_based). Discord's x-ratelimit-reset-after is no dimension.
    "openai": (
        "x-ratelimit-",
        re.compile(r"x-ratelimit-(?P<part>limit|remaining|reset)-(?!after$)(?P<dim>.+)"),
    ),
    # anthropic-ratelimit-input-tokens-remaining, ...-requests-reset, ...-unified-reset
    "anthropic": (
        "anthropic-ratelimit-",
        re.compile(r"anthropic-ratelimit-(?P<dim>.+)-(?P<part>limit|remaining|reset)"),
    ),
}


def _dimension_hints(
    fields: dict[str, str], source: Source, *, now: float | None, server_now: float | None
) -> list[QuotaHint]:
    """One hint per dimension (requests, tokens, input-tokens, ...) of a family that names the
    dimension in each field: OpenAI's and Anthropic's."""
    prefix, pattern = _DIMENSION_FIELDS[source]
    dimensions: dict[str, dict[str, str]] = {}
    for name, value in fields.items():
        if name.startswith(prefix) and (match := pattern.fullmatch(name)):
            dimensions.setdefault(match["dim"], {})[match["part"]] = value
    hints = []
    for dimension, parts in sorted(dimensions.items()):
        limit = _number(parts.get("limit"))
        # Only a dimension that counts down is a quota (Anthropic's unified-status and the like
        # are not); Azure's OpenAI sends -1 for a limit it does not report.
        if "remaining" not in parts or (limit is not None and limit < 0):
            continue
        hint = QuotaHint(
            limit=_count(parts.get("limit")),
            remaining=_remaining(parts["remaining"]),
            reset_after=_reset(parts.get("reset"), now=now, server_now=server_now),
            window=None,
            source=source,
            policy=dimension,
        )
        if _says_something(hint):
            hints.append(hint)
    return hints


_USED_OF = re.compile(rf"\s*({_DIGITS})\s*/\s*({_DIGITS})\s*", re.ASCII)


def _shopify_hints(fields: dict[str, str]) -> list[QuotaHint]:
    # X-Shopify-Shop-Api-Call-Limit: 39/40 (marbles in the bucket / its size). It leaks one request
    # at a time, so a full bucket takes one leak to admit the next request, not a whole reset.
    match = _USED_OF.fullmatch(fields.get("x-shopify-shop-api-call-limit", ""))
    if match is None:
        return []
    used, size = int(match[1]), int(match[2])
    return [
        QuotaHint(
            limit=size,
            remaining=max(0, size - used),
            reset_after=_clamp(max(0, used - size + 1) / SHOPIFY_LEAK_PER_SECOND),
            window=None,
            source="shopify",
        )
    ]


def _hubspot_hints(fields: dict[str, str]) -> list[QuotaHint]:
    # X-HubSpot-RateLimit-Daily / -Daily-Remaining: per day (API keys and private apps only)
    # X-HubSpot-RateLimit-Interval-Milliseconds: 10000, -Max: 100, -Remaining: 99: the burst
    # window, which HubSpot does not say the start of: a spent one waits a whole window.
    # X-HubSpot-RateLimit-Secondly / -Secondly-Remaining: per second (deprecated, still sent)
    prefix = "x-hubspot-ratelimit-"
    interval_ms = _non_negative(fields.get(prefix + "interval-milliseconds"))
    interval = None if interval_ms is None else interval_ms / 1000
    windows = [
        ("daily", "daily", "daily-remaining", DAY_SECONDS, UNKNOWN_RESET_PROBE_SECONDS),
        ("interval", "max", "remaining", interval, interval),
        ("secondly", "secondly", "secondly-remaining", 1.0, 1.0),
    ]
    hints = []
    for policy, limit_name, remaining_name, window, spent_wait in windows:
        remaining = _remaining(fields.get(prefix + remaining_name))
        if remaining is None:
            continue
        hints.append(
            QuotaHint(
                limit=_count(fields.get(prefix + limit_name)),
                remaining=remaining,
                reset_after=_clamp(spent_wait) if remaining == 0 and spent_wait else None,
                window=window,
                source="hubspot",
                policy=policy,
            )
        )
    return hints


# api-usage=25/15000; per-app-api-usage=17/250(appName=sample-connected-app)
_SALESFORCE_USAGE = re.compile(
    rf"(?:^|[;,])\s*(api-usage|per-app-api-usage)\s*=\s*({_DIGITS})\s*/\s*({_DIGITS})", re.ASCII
)


def _salesforce_hints(fields: dict[str, str]) -> list[QuotaHint]:
    # Sforce-Limit-Info: used/limit of the org's daily API requests, counted over a rolling 24 h:
    # no header says when enough old calls leave the window, so a spent quota asks again hourly.
    hints = []
    for name, used, limit in _SALESFORCE_USAGE.findall(fields.get("sforce-limit-info", "")):
        remaining = max(0, int(limit) - int(used))
        hints.append(
            QuotaHint(
                limit=int(limit),
                remaining=remaining,
                reset_after=UNKNOWN_RESET_PROBE_SECONDS if remaining == 0 else None,
                window=DAY_SECONDS,
                source="salesforce",
                policy=name,
            )
        )
    return hints


def _says_something(hint: QuotaHint) -> bool:
    return any(v is not None for v in (hint.limit, hint.remaining, hint.reset_after))


def _window_for(limit: int | None, policies: Iterable[_Member]) -> float | None:
    """The window of the integer policy item whose quota is `limit` ("100;w=60")."""
    for quota, params in policies:
        if limit is not None and _sf_count(quota) == limit and "w" in params:
            return _sf_seconds(params["w"])
    return None


# --- Plain header values ---------------------------------------------------------------------

_NUMBER = re.compile(rf"-?{_DIGITS}(?:\.{_DIGITS})?", re.ASCII)


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


def _reset(value: str | None, *, now: float | None, server_now: float | None) -> float | None:
    """Seconds until a reset given as delta-seconds, an epoch (seconds or milliseconds), a
    duration ("6m0s", OpenAI), an HTTP-date or an ISO 8601 date-time (Anthropic, Mastodon, Jira)."""
    number = _non_negative(value)
    if number is not None:
        return _reset_after(number, now=now, server_now=server_now)
    duration = _duration(value)
    if duration is not None:
        return _clamp(duration)
    moment = _http_date(value)  # a few servers send the reset as an HTTP-date
    if moment is None:
        moment = _iso_datetime(value)
    if moment is None:
        return None
    return _seconds_until(moment, now=now, server_now=server_now)


# Go's time.Duration as OpenAI prints it: "6m0s", "1m12.5s", "20ms", "1h2m3s", "0s".
_DURATION_PART = re.compile(rf"({_DIGITS}(?:\.{_DIGITS})?)(h|ms|m|s|us|µs|μs|ns)")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6,
                   "μs": 1e-6, "ns": 1e-9}  # fmt: skip


def _duration(value: str | None) -> float | None:
    if value is None or not _DURATION.fullmatch(text := value.strip()):
        return None
    return sum(float(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(text))


# A date and at least hours and minutes: Jira's "2024-05-21T10:15Z" has no seconds.
_ISO_DATETIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}", re.ASCII)


def _iso_datetime(value: str | None) -> float | None:
    """Epoch seconds of an ISO 8601 / RFC 3339 date-time; one without an offset is UTC, as
    every API that sends these means it."""
    if not value or not _ISO_DATETIME.match(text := value.strip()):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _reset_after(value: float, *, now: float | None, server_now: float | None) -> float | None:
    """Seconds until a reset given as delta-seconds, epoch seconds or epoch milliseconds."""
    if value > EPOCH_MILLIS_THRESHOLD:
        value /= 1000
    if value > EPOCH_SECONDS_THRESHOLD:
        return _seconds_until(value, now=now, server_now=server_now)
    return _clamp(value)


def _seconds_until(moment: float, *, now: float | None, server_now: float | None) -> float | None:
    """Seconds from now until `moment` (epoch seconds); None with no clock to read it on.

    The server's reset and its Date come from one clock, so their difference is right whatever
    that clock's error; without a Date, `now` (the limiter's clock) is the one clock shared by
    every worker."""
    reference = now if server_now is None else server_now
    return None if reference is None else _clamp(moment - reference)


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


def _sf_reset(value: object, *, now: float | None, server_now: float | None) -> float | None:
    seconds = _sf_seconds(value)
    return None if seconds is None else _reset_after(seconds, now=now, server_now=server_now)
