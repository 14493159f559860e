"""One header value read on its own: Retry-After, and the numbers, counts and resets that every
family's fields carry (delta-seconds, epochs in seconds or milliseconds, Go durations, HTTP-dates
and ISO 8601 date-times), clamped to what a hint may ask for."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

# No hint from this package asks for more than a day. A Retry-After of years is a broken server,
# a misread date or an epoch sent where seconds belong; obeying it would freeze every worker on
# that API with nothing to show for it. After a day one request asks again and gets a fresh answer.
MAX_DELAY_SECONDS = 24 * 60 * 60.0
# A reset bigger than this is an epoch, not a count of seconds: no API counts down 31 years, and
# every epoch since 2001-09-09 is bigger. Fixed rather than relative to `now` so the reading of a
# header never depends on the caller's clock.
EPOCH_SECONDS_THRESHOLD = 1e9
# ... and bigger than this an epoch in milliseconds (as seconds it would be the year 33658).
EPOCH_MILLIS_THRESHOLD = 1e12
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
DIGITS = rf"[0-9]{{1,{MAX_DIGITS}}}(?![0-9])"


def parse_retry_after(value: str | None, *, now: float | None) -> float | None:
    """Seconds to wait from `now` (epoch seconds): delta-seconds or an HTTP-date, capped at
    MAX_DELAY_SECONDS; None when the value is absent, garbage or negative, or a date with no
    `now` to read it against."""
    if value is None:
        return None
    text = value.strip()
    seconds = non_negative(text)
    if seconds is None:
        if _NUMBER.fullmatch(text):
            return None  # a negative number is not a date either
        moment = http_date(text)
        if moment is None:
            return None
        return _seconds_until(moment, now=now, server_now=None)
    return clamp(seconds)


_NUMBER = re.compile(rf"-?{DIGITS}(?:\.{DIGITS})?", re.ASCII)


def read_number(value: str | None) -> float | None:
    if value is None or not _NUMBER.fullmatch(text := value.strip()):
        return None
    number = float(text)
    return number if math.isfinite(number) else None


def non_negative(value: str | None) -> float | None:
    number = read_number(value)
    return None if number is None or number < 0 else number


def read_count(value: str | None) -> int | None:
    number = non_negative(value)
    return None if number is None else int(number)


def read_remaining(value: str | None) -> int | None:
    # Reddit sends "598.0"; round down, a fraction of a request cannot be sent. Below zero is an
    # overdrawn quota, which for us is the same as a spent one.
    number = read_number(value)
    return None if number is None else max(0, math.floor(number))


def read_reset(value: str | None, *, now: float | None, server_now: float | None) -> float | None:
    """Seconds until a reset given as delta-seconds, an epoch (seconds or milliseconds), a
    duration ("6m0s", OpenAI), an HTTP-date or an ISO 8601 date-time (Anthropic, Mastodon, Jira)."""
    number = non_negative(value)
    if number is not None:
        return reset_from_number(number, now=now, server_now=server_now)
    duration = _duration(value)
    if duration is not None:
        return clamp(duration)
    moment = http_date(value)  # a few servers send the reset as an HTTP-date
    if moment is None:
        moment = _iso_datetime(value)
    if moment is None:
        return None
    return _seconds_until(moment, now=now, server_now=server_now)


# Go's time.Duration as OpenAI prints it: "6m0s", "1m12.5s", "20ms", "1h2m3s", "0s".
_DURATION_PART = re.compile(rf"({DIGITS}(?:\.{DIGITS})?)(h|ms|m|s|us|µs|μs|ns)")
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


def reset_from_number(value: float, *, now: float | None, server_now: float | None) -> float | None:
    """Seconds until a reset given as delta-seconds, epoch seconds or epoch milliseconds."""
    if value > EPOCH_MILLIS_THRESHOLD:
        value /= 1000
    if value > EPOCH_SECONDS_THRESHOLD:
        return _seconds_until(value, now=now, server_now=server_now)
    return clamp(value)


def _seconds_until(moment: float, *, now: float | None, server_now: float | None) -> float | None:
    """Seconds from now until `moment` (epoch seconds); None with no clock to read it on.

    The server's reset and its Date come from one clock, so their difference is right whatever
    that clock's error; without a Date, `now` (the limiter's clock) is the one clock shared by
    every worker."""
    reference = now if server_now is None else server_now
    return None if reference is None else clamp(moment - reference)


def clamp(seconds: float) -> float:
    return min(max(seconds, 0.0), MAX_DELAY_SECONDS)


def http_date(value: str | None) -> float | None:
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


def normalise(headers: Mapping[str, str]) -> dict[str, str]:
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
