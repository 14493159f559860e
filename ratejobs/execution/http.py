"""Send one request with requests: bounded in time and size, redirects followed by hand,
credentials kept on the API's own origin and path, and every network failure returned as a
result rather than raised. Where it may connect is connections.py's; how a failure is said,
errors.py's; the total timeout's watchdog, watchdog.py's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3

from ratejobs.execution.connections import open_response
from ratejobs.execution.errors import (
    MAX_ERROR_CHARS,
    SEND_ERRORS,
    ErrorKind,
    describe,
    is_timeout,
    where,
)
from ratejobs.execution.outbound import AddressRefused
from ratejobs.execution.request import HttpRequest
from ratejobs.execution.targets import check_climb, redact_url, url_origin
from ratejobs.execution.watchdog import watched

# Long enough for a TLS handshake across continents; a host that cannot accept a connection in
# this time is down, and waiting longer only holds the limiter's lease.
DEFAULT_CONNECT_TIMEOUT = 5.0
# Seconds between bytes of the response; slow endpoints (exports, searches) need tens of seconds.
DEFAULT_READ_TIMEOUT = 30.0
# The response body is kept for the call's record; a mebibyte covers any JSON an API answers
# one call with, and a runaway download (or a decompression bomb) stops there.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Response headers kept for the call's record and the limiter. APIs send a dozen or two, a few
# hundred bytes each; past these the rest is padding (or an attack on the database row) and is
# dropped. http.client itself refuses more than 100 header lines of up to 64 KiB each.
MAX_RESPONSE_HEADERS = 64
MAX_RESPONSE_HEADER_BYTES = 64 * 1024
# Redirects followed before the 3xx itself becomes the result; real APIs use one or two (a
# trailing slash, a moved resource), more is a loop.
MAX_REDIRECTS = 5
# Read size while streaming the body: small enough that the cap and the deadline are checked
# often, big enough that a 1 MiB body takes a few dozen reads.
CHUNK_BYTES = 64 * 1024
# A socket timeout set to the time left can wake a hair before the deadline: within this, the
# total timeout is what expired.
DEADLINE_SLACK_SECONDS = 0.05

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Dropped, besides the API's own credential headers, on a redirect that leaves the API's scope.
_ALWAYS_CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization"})


@dataclass(frozen=True, repr=False)
class HttpResult:
    """What came back. error_kind is None when a whole response arrived; otherwise status_code
    is the status if one arrived before the failure, and body what was read of it."""

    status_code: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    truncated: bool = False  # the body was longer than max_body_bytes and was cut there
    error_kind: ErrorKind | None = None
    error: str = ""
    duration: float = 0.0  # seconds for the whole exchange, redirects included
    url: str = ""  # the URL that gave this result (after redirects)
    redirects: int = 0
    # some headers were dropped: more than MAX_RESPONSE_HEADERS or MAX_RESPONSE_HEADER_BYTES
    headers_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.status_code is not None

    def header(self, name: str) -> str | None:
        """A response header by case-insensitive name."""
        return header_value(self.headers, name)

    def __repr__(self) -> str:
        # Response headers can carry cookies or tokens: names only.
        return (
            f"HttpResult(status_code={self.status_code!r}, error_kind={self.error_kind!r}, "
            f"error={self.error!r}, body=<{len(self.body)} bytes>, truncated={self.truncated}, "
            f"duration={self.duration:.3f}, url={redact_url(self.url)!r}, "
            f"redirects={self.redirects}, headers={sorted(self.headers)!r}, "
            f"headers_truncated={self.headers_truncated})"
        )


class _TotalTimeout(Exception):
    pass


def send(
    session: requests.Session,
    request: HttpRequest,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    total_timeout: float | None = None,
    max_redirects: int = MAX_REDIRECTS,
) -> HttpResult:
    """Send `request` with a session from new_session() and read at most max_body_bytes of the
    response.

    Redirects are followed by hand, at most `max_redirects` (0: a 3xx is the answer), each
    hop through the outbound
    policy. The credentials stay on while the target is on the request's scope (its base URL:
    same scheme, host and port, under the base path); a redirect anywhere else is followed
    without them (nor Authorization or Cookie) from then on. `total_timeout` bounds the whole
    exchange, connecting and every byte included. Network failures and refused addresses are
    results with an error_kind; a URL requests cannot send to raises ValueError (naming the URL
    with its query values masked).
    """
    started = time.monotonic()
    deadline = None if total_timeout is None else started + total_timeout
    method, url, body = request.method, request.url, request.body
    headers = dict(request.headers)
    scope = request.base_url or _root(request.url)
    redirects = 0
    status: int | None = None
    response_headers: dict[str, str] = {}
    headers_truncated = False
    chunks: list[bytes] = []

    def result(**fields: Any) -> HttpResult:
        return HttpResult(
            status_code=status,
            headers=response_headers,
            headers_truncated=headers_truncated,
            body=b"".join(chunks),
            duration=time.monotonic() - started,
            url=url,
            redirects=redirects,
            **fields,
        )

    def timed_out() -> HttpResult:
        return result(
            truncated=bool(chunks),
            error_kind="timeout",
            error=f"no complete response from {where(url)} within {total_timeout}s in total",
        )

    hop_connect, hop_read = connect_timeout, read_timeout
    with watched(total_timeout) as dog:
        try:
            while True:
                # Each hop starts afresh: a failure after a redirect is that hop's, not the 3xx's.
                status, response_headers, headers_truncated = None, {}, False
                if deadline is not None:
                    # Each connect and each read waits at most for the time left; the watchdog
                    # covers a server that answers every read just in time.
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _TotalTimeout
                    hop_connect, hop_read = min(connect_timeout, left), min(read_timeout, left)
                response = open_response(
                    session, method, url, headers, body, (hop_connect, hop_read)
                )
                try:
                    status = response.status
                    # repeated headers joined with ", ", as requests showed them
                    response_headers, headers_truncated = _capped_headers(dict(response.headers))
                    target = _redirect_target(status, response.headers.get("Location"), url)
                    if target is not None and redirects < max_redirects:
                        redirects += 1
                        method, body, headers = _redirected(status, method, body, headers)
                        if not _in_scope(target, scope):
                            headers = _without_credentials(headers, request.credential_headers)
                        url = target
                        continue
                    truncated = _read_capped(response, chunks, max_body_bytes, deadline)
                    if dog is not None and dog.fired:  # a body read to its close, cut short
                        return timed_out()
                    return result(truncated=truncated)
                finally:
                    # A body read to its end has given its connection back to the pool
                    # already; one cut short (a redirect, a cap) closes it.
                    response.close()
                    response.release_conn()
        except _TotalTimeout:
            return timed_out()
        except AddressRefused as exc:
            return result(error_kind="refused", error=str(exc)[:MAX_ERROR_CHARS])
        except SEND_ERRORS as exc:
            fired = dog is not None and dog.fired
            if isinstance(exc, ValueError) and not fired:  # InvalidURL, MissingSchema, ...
                if redirects:  # the server's Location, not the caller's URL
                    return result(
                        error_kind="connection",
                        error=f"redirect to {where(url)} could not be sent: {type(exc).__name__}",
                    )
                # the message may quote the URL (and a bad header's value): say it without.
                raise ValueError(
                    f"cannot send {request.method} {redact_url(url)}: {type(exc).__name__}"
                ) from None
            kind, message = describe(exc, url, connect_timeout=hop_connect, read_timeout=hop_read)
            past = deadline is not None and time.monotonic() >= deadline - DEADLINE_SLACK_SECONDS
            if fired or (past and is_timeout(exc)):
                if kind != "connect":
                    return timed_out()
                message = f"could not connect to {where(url)} within {total_timeout}s in total"
            return result(error_kind=kind, error=message)


def _read_capped(
    response: urllib3.BaseHTTPResponse, chunks: list[bytes], limit: int, deadline: float | None
) -> bool:
    """Append up to `limit` bytes of the (decoded) body to `chunks`; whether there was more.

    read1 returns whatever one read of the socket gave, so the deadline is checked as bytes
    trickle in (iter_content would block until a whole chunk arrived), and what arrived before
    a failure is kept. It also decompresses no more than it is asked for."""
    size = 0
    while chunk := response.read1(CHUNK_BYTES, decode_content=True):
        if size + len(chunk) > limit:
            chunks.append(chunk[: limit - size])
            return True
        chunks.append(chunk)
        size += len(chunk)
        if deadline is not None and time.monotonic() > deadline:
            raise _TotalTimeout
    return False


def _redirect_target(status: int, location: str | None, url: str) -> str | None:
    """The http(s) URL a redirect points at; None for anything else (not a redirect, no
    Location, another scheme, a URL with credentials or spaces in it), which is then the
    result as it is."""
    if status not in _REDIRECTS or not location:
        return None
    try:
        target = urljoin(url, location.strip())
        parts = urlsplit(target)
        parts.port  # noqa: B018 - raises on a port out of range or not a number
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    if parts.username is not None or parts.password is not None:
        return None  # requests would turn them into an Authorization header
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in target):
        return None
    return target


def _in_scope(target: str, scope: str) -> bool:
    """Whether `target` is where the credentials of `scope` (an API's base URL) may go: same
    scheme, host and port, and a path under the base path by every reading (segment by
    segment, and no escaped "..", "%2F" or backslash climbing out of it)."""
    if url_origin(target) != url_origin(scope):
        return False
    base = urlsplit(scope).path.rstrip("/")
    path = urlsplit(target).path
    if base and not (path == base or path.startswith(base + "/")):
        return False
    try:
        check_climb(path[len(base) :])
    except ValueError:
        return False
    return True


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """A header by case-insensitive name from a plain mapping (a response's headers as kept)."""
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def _without_credentials(headers: dict[str, str], names: frozenset[str]) -> dict[str, str]:
    dropped = _ALWAYS_CREDENTIALS | names
    return {k: v for k, v in headers.items() if k.lower() not in dropped}


def _capped_headers(headers: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """At most MAX_RESPONSE_HEADERS headers of MAX_RESPONSE_HEADER_BYTES in all, in the order
    they came; whether any were dropped. One huge header is skipped, not the ones after it."""
    kept: dict[str, str] = {}
    size = 0
    dropped = False
    for name, value in headers.items():
        cost = len(name) + len(value)
        if len(kept) >= MAX_RESPONSE_HEADERS or size + cost > MAX_RESPONSE_HEADER_BYTES:
            dropped = True
            continue
        kept[name] = value
        size += cost
    return kept, dropped


def _redirected(
    status: int, method: str, body: bytes | None, headers: dict[str, str]
) -> tuple[str, bytes | None, dict[str, str]]:
    # As browsers and requests do: 303 turns everything but HEAD into a GET, 301/302 turn a
    # POST into a GET; 307/308 repeat the request as it was.
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        without_body = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        return "GET", None, without_body
    return method, body, headers


def _root(url: str) -> str:
    """The origin of `url` as a base URL: the scope of a request built without one."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
