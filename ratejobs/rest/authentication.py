"""The REST API's token sign-in, throttled: bad tokens counted per client address in the shared
cache (ratejobs/login_throttle.py), 429 with Retry-After past the limit. The same DRF token is
taken after `Token` (DRF's own word) or `Bearer` (what most HTTP clients and OAuth-minded tools
send, RFC 6750's word)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
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

# The words an Authorization header may start with, lower case (HTTP's schemes are
# case-insensitive).
KEYWORDS = ("token", "bearer")


class ThrottledTokenAuthentication(TokenAuthentication):
    """DRF's TokenAuthentication, counting the bad tokens each address sends. While an address
    is locked every token it sends is refused unchecked, a right one too: were a right token
    let through, 200 against 429 would tell a guesser which guess was right, and the limit
    would not slow guessing at all. Other addresses, and sessions from the locked one, are
    not affected; a request without a token is not counted. `Bearer` is another word for
    `Token`: the same tokens, counted in the same count."""

    def authenticate(self, request: Any) -> Any:
        words = get_authorization_header(request).split()
        if not words or words[0].lower() not in (word.encode() for word in KEYWORDS):
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
            return self.authenticate_credentials(_token(words))
        except exceptions.AuthenticationFailed:
            for limit in counts.fail(limits):
                log_reached(limit, address=address)
            raise

    def authenticate_header(self, request: Any) -> str:
        # Two challenges (RFC 9110, 11.6.1): a client told only "Token" would not know that its
        # Bearer header is taken too.
        return "Token, Bearer"


def _token(words: list[bytes]) -> str:
    """The token after the scheme's word, refused as DRF refuses it (a header that is not
    `<word> <token>` is a bad token, and counted as one)."""
    if len(words) == 1:
        raise exceptions.AuthenticationFailed("Invalid token header. No credentials provided.")
    if len(words) > 2:
        raise exceptions.AuthenticationFailed(
            "Invalid token header. Token string should not contain spaces."
        )
    try:
        return words[1].decode()
    except UnicodeError:
        raise exceptions.AuthenticationFailed(
            "Invalid token header. Token string should not contain invalid characters."
        ) from None


class ThrottledTokenScheme(OpenApiAuthenticationExtension):
    """The schema's tokenAuth says both words (drf-spectacular's own says `Token` only)."""

    target_class = ThrottledTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'A token with the prefix "Token" or "Bearer": `Token <key>` or '
            "`Bearer <key>` (python manage.py drf_create_token USER)",
        }
