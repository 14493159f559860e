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

    def __init__(self, retry_after: float, *, at_capacity: bool = False) -> None:
        if at_capacity:
            message = f"every in-flight place is taken (first lease ends in {retry_after:.3f}s)"
        else:
            message = f"next slot in {retry_after:.3f}s, longer than the caller's max_wait"
        super().__init__(message)
        self.retry_after = retry_after
        # True: the pace had a slot, the in-flight cap had no place; any release makes one,
        # so retry_after (the earliest lease's expiry) is only the latest it can take.
        self.at_capacity = at_capacity
