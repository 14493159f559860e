"""Exponential backoff with AWS's "full jitter": spread retries over the whole window so
many workers retrying after one outage do not come back in lockstep."""

from __future__ import annotations

import math
import random


def backoff_ceiling(attempt: int, *, base: float, cap: float) -> float:
    """min(cap, base * 2**attempt): the longest a retry after `attempt` earlier retries waits."""
    if not isinstance(attempt, int) or attempt < 0:
        raise ValueError("attempt must be a whole number >= 0")
    if not (math.isfinite(base) and base >= 0 and math.isfinite(cap) and cap >= 0):
        raise ValueError("base and cap must be finite numbers >= 0")
    try:
        return min(cap, math.ldexp(base, attempt))
    except OverflowError:  # base * 2**attempt beyond a float: far past any cap
        return cap


def full_jitter(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after `attempt` earlier retries: uniform(0, min(cap, base * 2**attempt))."""
    ceiling = backoff_ceiling(attempt, base=base, cap=cap)
    return (rng or random).uniform(0.0, ceiling)
