"""A limiter's limits, validated before they reach Redis."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

# Below a twentieth of its published rate an API is better served by blocks (Retry-After) than
# by crawling on, so adaptive mode stops cutting there unless told otherwise.
DEFAULT_MIN_RATE_FRACTION = 0.05
# AWS's adaptive retry mode cuts by 0.7 (CUBIC's beta); gentler than AIMD's 0.5, which halves
# throughput on every burst of 429s.
DEFAULT_DECREASE_FACTOR = 0.7
# Time for the adaptive rate to climb back to where it was before a cut. Every 429 costs a
# Retry-After block (a whole second or more) for every worker, so fewer cuts beat a faster
# climb: simulated against a 10/s server with a burst of 2 to 5, 20 s used 87-93% of the real
# limit with about 1% 429s, where 10 s used 81-90% with 1.3-1.6%.
DEFAULT_RECOVERY_SECONDS = 20.0
# What the limiter carries: slots are whole microseconds on Redis's clock, so no more than a
# million requests a second, and no slower than one request per MAX_PERIOD (a leap year).
# A rate per period, a burst and an in-flight cap above these are refused, never stored.
MAX_RATE = 1_000_000.0
MAX_PER_SECOND = 1_000_000.0
MAX_PERIOD = 366 * 86_400.0
MAX_BURST = 1_000_000
MAX_CONCURRENCY = 100_000
# Windows besides the main rate (an hourly and a daily quota, tokens per minute): each is one
# more GCRA schedule checked in the same script, so a handful, not hundreds.
MAX_WINDOWS = 8
# A call's cost in a "cost" window (tokens): whole units, 0 when it costs nothing there.
MAX_COST = 1_000_000_000

WindowUnit = Literal["requests", "cost"]
WINDOW_UNITS: tuple[WindowUnit, ...] = ("requests", "cost")


@dataclass(frozen=True)
class Window:
    """One more limit every grant must also fit: `rate` units per `period` seconds, up to
    `burst` at once. unit "requests" counts each request's weight, as the main rate does;
    "cost" counts what the call says it costs (tokens), corrected after the response."""

    rate: float
    period: float
    burst: int
    unit: WindowUnit = "requests"

    def __post_init__(self) -> None:
        errors = _rate_errors(self.rate, self.period, self.burst)
        if self.unit not in WINDOW_UNITS:
            errors.append(f"unit must be one of {', '.join(WINDOW_UNITS)}")
        if errors:
            raise ValueError("; ".join(errors))

    @property
    def label(self) -> str:
        """How the window is named in metrics and pages: "300/60s", "90000 cost/60s"."""
        unit = "" if self.unit == "requests" else " cost"
        return f"{self.rate:g}{unit}/{self.period:g}s"

    def as_json(self) -> dict:
        return {"rate": self.rate, "period": self.period, "burst": self.burst, "unit": self.unit}


def _rate_errors(rate: object, period: object, burst: object) -> list[str]:
    """What is wrong with `rate` per `period` seconds with `burst` (the main rate's bounds and
    every window's)."""
    errors = []
    if not is_positive_number(rate) or rate > MAX_RATE:
        errors.append(f"rate must be a positive number of at most {MAX_RATE:,.0f}")
    if not is_positive_number(period) or period > MAX_PERIOD:
        errors.append(f"period must be a positive number of seconds, at most {MAX_PERIOD:,.0f}")
    if not errors and rate / period > MAX_PER_SECOND:
        errors.append(f"rate / period must be at most {MAX_PER_SECOND:,.0f} requests a second")
    if not errors and period / rate > MAX_PERIOD:
        errors.append(f"period / rate must be at most {MAX_PERIOD:,.0f} seconds a request")
    if not isinstance(burst, int) or isinstance(burst, bool) or not 1 <= burst <= MAX_BURST:
        errors.append(f"burst must be a whole number from 1 to {MAX_BURST:,}")
    return errors


@dataclass(frozen=True)
class LimiterConfig:
    """`rate` requests per `period` seconds with up to `burst` at once.

    burst 1 spaces requests evenly. max_concurrency 0 means no in-flight cap. With adaptive, the
    current rate moves between min_rate and rate with the API's throttling signals.
    """

    rate: float
    period: float = 1.0
    burst: int = 1
    max_concurrency: int = 0
    adaptive: bool = False
    min_rate: float | None = None
    decrease_factor: float = DEFAULT_DECREASE_FACTOR
    recovery_seconds: float = DEFAULT_RECOVERY_SECONDS
    # Which edition of the limits this is, from their source of truth: Redis keeps the version
    # it was configured with, never overwrites it with an older one, and asks a caller whose
    # version is newer to configure again. 0: unversioned (any configure writes).
    version: int = 0
    # Every grant must fit each of these too (atomically, in the same script as the main rate).
    windows: tuple[Window, ...] = ()
    # With adaptive: learn the API's real limit from what it accepted around each throttle and
    # hold just under it (False: plain CUBIC, cut and climb back). See lua/lib/adaptive.lua.
    learn: bool = True

    def __post_init__(self) -> None:
        errors = _rate_errors(self.rate, self.period, self.burst)
        if not isinstance(self.max_concurrency, int) or not (
            0 <= self.max_concurrency <= MAX_CONCURRENCY
        ):
            errors.append(
                f"max_concurrency must be a whole number from 0 (no cap) to {MAX_CONCURRENCY:,}"
            )
        if self.min_rate is not None and not (
            is_positive_number(self.min_rate) and self.min_rate <= (self.rate or 0)
        ):
            errors.append("min_rate must be positive and at most rate")
        if not (isinstance(self.decrease_factor, int | float) and 0 < self.decrease_factor < 1):
            errors.append("decrease_factor must be between 0 and 1")
        if not is_positive_number(self.recovery_seconds):
            errors.append("recovery_seconds must be a positive number")
        if not isinstance(self.learn, bool):
            errors.append("learn must be true or false")
        if not isinstance(self.version, int) or self.version < 0:
            errors.append("version must be a whole number, 0 or more")
        if not isinstance(self.windows, tuple) or not all(
            isinstance(w, Window) for w in self.windows
        ):
            errors.append("windows must be a tuple of Window")
        elif len(self.windows) > MAX_WINDOWS:
            errors.append(f"at most {MAX_WINDOWS} windows")
        if errors:
            raise ValueError("; ".join(errors))

    @property
    def floor_rate(self) -> float:
        if self.min_rate is not None:
            return self.min_rate
        return self.rate * DEFAULT_MIN_RATE_FRACTION

    def as_script_args(self) -> list[str]:
        """The values configure.lua stores, as canonical strings so equal configs compare equal."""
        return [
            repr(float(self.rate)),
            repr(float(self.period)),
            str(self.burst),
            str(self.max_concurrency),
            "1" if self.adaptive else "0",
            repr(float(self.floor_rate)),
            repr(float(self.decrease_factor)),
            repr(float(self.recovery_seconds)),
            str(self.version),
            windows_arg(self.windows),
            "1" if self.learn else "0",
        ]

    @property
    def max_cost(self) -> int | None:
        """The largest cost one call may have: the smallest burst of the cost windows (None
        without any, when cost is not limited)."""
        bursts = [w.burst for w in self.windows if w.unit == "cost"]
        return min(bursts) if bursts else None


def windows_arg(windows: tuple[Window, ...]) -> str:
    """The windows as configure.lua stores them: "rate,period,burst,unit;..." in canonical
    strings, "" for none."""
    return ";".join(f"{float(w.rate)!r},{float(w.period)!r},{w.burst},{w.unit}" for w in windows)


def is_positive_number(value: object) -> bool:
    """A finite number above zero (bools are not numbers here)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
