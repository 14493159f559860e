"""The shared Redis rate limiter: one per third-party API, for every worker (no Django, Celery)."""

from __future__ import annotations

from ratejobs.limiter.aio import AsyncLimiter
from ratejobs.limiter.config import LimiterConfig, Window
from ratejobs.limiter.core import (
    Feedback,
    Grant,
    GrantBatch,
    LimiterCounts,
    LimiterState,
    RateSample,
    WindowState,
)
from ratejobs.limiter.errors import (
    LimiterError,
    LimiterNotConfigured,
    LimiterUnavailable,
    NamespaceUnknown,
    TooBig,
    WaitTooLong,
)
from ratejobs.limiter.sync import Limiter

__all__ = [
    "AsyncLimiter",
    "Feedback",
    "Grant",
    "GrantBatch",
    "Limiter",
    "LimiterConfig",
    "LimiterCounts",
    "LimiterError",
    "LimiterNotConfigured",
    "LimiterState",
    "LimiterUnavailable",
    "NamespaceUnknown",
    "RateSample",
    "TooBig",
    "WaitTooLong",
    "Window",
    "WindowState",
]
