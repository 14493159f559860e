"""Exceptions raised by the limiter."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ratejobs.limiter.core import Grant


class LimiterError(Exception):
    """Base class for limiter failures."""


class LimiterUnavailable(LimiterError):
    """Redis could not be reached: nothing may be sent (the limiter fails closed); retry later."""


class LimiterNotConfigured(LimiterError):
    """The limiter has no configuration in Redis and none was given to configure it."""


class TooBig(LimiterError, ValueError):
    """The request takes more units than some window's burst: no wait makes room for it, so it
    can never be granted (a ValueError too, as the arguments are what is wrong)."""


class WaitTooLong(LimiterError):
    """The next slot is further away than the caller agreed to wait. Nothing is held, unless
    the caller asked to keep its place: then `place` is the reservation of that slot (a Grant,
    not ready), to confirm when it comes (Limiter.confirm with keep_place)."""

    def __init__(
        self, retry_after: float, *, at_capacity: bool = False, place: Grant | None = None
    ) -> None:
        if at_capacity:
            message = f"every in-flight place is taken (first lease ends in {retry_after:.3f}s)"
        else:
            message = f"next slot in {retry_after:.3f}s, longer than the caller's max_wait"
            if place is not None:
                message += "; the place is kept"
        super().__init__(message)
        self.retry_after = retry_after
        # True: the pace had a slot, the in-flight cap had no place; any release makes one,
        # so retry_after (the earliest lease's expiry) is only the latest it can take.
        self.at_capacity = at_capacity
        self.place = place


class NamespaceUnknown(LimiterError):
    """Nothing in the environment says which deployment's buckets a limiter should use
    (ratejobs.limiter.deployment)."""
