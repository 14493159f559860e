"""Signatures of job callbacks (pure): HMAC-SHA256 over "<unix time>.<body>", sent as
`X-Ratejobs-Signature: t=<unix time>,v1=<hex>`, as Stripe signs its webhooks. The time inside
the signed bytes lets a receiver refuse a recorded delivery replayed later."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

SIGNATURE_HEADER = "X-Ratejobs-Signature"
SCHEME = "v1"
# What a receiver should accept between our clock and theirs, and a delivery's time in transit.
DEFAULT_TOLERANCE_SECONDS = 300
# Prefix of every secret, so one pasted in the wrong place is recognisable (and greppable).
SECRET_PREFIX = "rjwhsec_"  # noqa: S105 - a marker, not a secret
# 32 random bytes: as strong as the HMAC-SHA256 key can use.
SECRET_BYTES = 32
# Unix seconds have 10 digits until the year 2286; a longer `t` is forged, and one of thousands
# of digits would make int() or the clock arithmetic raise instead of answering False.
MAX_TIMESTAMP_DIGITS = 12


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """Hex HMAC-SHA256, keyed with the secret's UTF-8 bytes, of b"<timestamp>." + body."""
    signed = f"{int(timestamp)}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, timestamp: int) -> str:
    """The X-Ratejobs-Signature value for `body` sent at `timestamp` (Unix seconds)."""
    return f"t={int(timestamp)},{SCHEME}={signature(secret, body, timestamp)}"


def verify(
    secret: str,
    body: bytes,
    header: str | None,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """Whether `header` signs `body` with `secret` at a time within `tolerance` seconds of
    `now`. Unknown schemes are ignored, so a later scheme can be sent beside v1. Any malformed
    header is False, never an exception: a receiver refuses it rather than fail with a 500."""
    # ours is ASCII; with anything else str.isdigit() takes "²" for a digit and
    # hmac.compare_digest() raises TypeError
    if not isinstance(header, str) or not header or not header.isascii():
        return False
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit() and len(value) <= MAX_TIMESTAMP_DIGITS:
            timestamp = int(value)
        elif name == SCHEME:
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    moment = time.time() if now is None else now
    if abs(moment - timestamp) > tolerance:
        return False
    expected = signature(secret, body, timestamp)
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
