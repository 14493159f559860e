"""Exceptions raised by the limiter."""

from __future__ import annotations


class LimiterError(Exception):
    """Base class for limiter failures."""


class LimiterUnavailable(LimiterError):
    """Redis could not be reached: nothing may be sent (the limiter fails closed); retry later."""


class LimiterNotConfigured(LimiterError):
    """The limiter has no configuration in Redis and none was given to configure it."""


class WaitTooLong(LimiterError):
    """The next slot is further away than the caller agreed to wait; nothing is held."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"next slot in {retry_after:.3f}s, longer than the caller's max_wait")
        self.retry_after = retry_after
