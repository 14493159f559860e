"""The REST API's token sign-in, throttled: bad tokens counted per client address in the shared
cache (ratejobs/login_throttle.py), 429 with Retry-After past the limit."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header

from ratejobs.login_throttle import (
    failure_counts,
    log_reached,
    log_refused,
    request_address,
    token_limits,
    wait_text,
)


class ThrottledTokenAuthentication(TokenAuthentication):
    """DRF's TokenAuthentication, counting the bad tokens each address sends. While an address
    is locked every token it sends is refused unchecked, a right one too: were a right token
    let through, 200 against 429 would tell a guesser which guess was right, and the limit
    would not slow guessing at all. Other addresses, and sessions from the locked one, are
    not affected; a request without a token is not counted."""

    def authenticate(self, request: Any) -> Any:
        words = get_authorization_header(request).split()
        if not words or words[0].lower() != self.keyword.lower().encode():
            return None  # no token: SessionAuthentication's turn, or anonymous
        address = request_address(request)
        limits = token_limits(address)
        counts = failure_counts()
        lock = counts.lock(limits)
        if lock is not None:
            log_refused(lock, address=address)
            raise exceptions.Throttled(
                lock.retry_after,
                detail=f"Too many bad tokens from your address: "
                f"{lock.failures} in {wait_text(settings.RATEJOBS_LOGIN_LOCKOUT_SECONDS)} "
                "(RATEJOBS_LOGIN_FAILURES_PER_ADDRESS); every token it sends is refused for now.",
            )
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed:
            for limit in counts.fail(limits):
                log_reached(limit, address=address)
            raise
