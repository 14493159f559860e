"""What went wrong in sending, said as a kind and a message safe to keep.

Error kinds say how far the request got, which decides whether a retry could repeat a side
effect:
- "refused": the outbound policy allows no address of the host; nothing was sent, and a retry
  would only be refused again.
- "connect": no connection was made (refused, DNS, TLS, connect timeout); the server never saw
  the request.
- "timeout": connected and sent, but the response did not arrive within the read timeout (per
  read) or the total timeout (the whole exchange).
- "connection": the connection broke after the request was sent (reset, closed early, a body
  that ended short or did not decode).

A message names the origin, never the path or query (which may hold a key).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

import requests
import urllib3.exceptions

from ratejobs.execution.targets import redact_url, url_origin

ErrorKind = Literal["refused", "connect", "timeout", "connection"]

# Error text is cut here: it ends up in the call's record and in logs.
MAX_ERROR_CHARS = 300


def where(url: str) -> str:
    """The origin of `url`, as an error message names it."""
    scheme, host, port = url_origin(url)
    return f"{scheme}://{host}:{port}"


def describe(
    exc: BaseException, url: str, *, connect_timeout: float, read_timeout: float
) -> tuple[ErrorKind, str]:
    """The kind of a failure to send to `url` (one of SEND_ERRORS) and its message."""
    chain = _chain(exc)
    origin = where(url)
    reason = _reason(chain, url)
    # NewConnectionError is a ConnectTimeoutError to urllib3 (for old callers): test it first.
    if _any(chain, _CONNECT_FAILURES):
        return "connect", f"could not connect to {origin}: {reason}"
    if _any(chain, _CONNECT_TIMEOUTS):
        return "connect", f"could not connect to {origin} within {connect_timeout}s"
    if _any(chain, _READ_TIMEOUTS):
        return "timeout", f"no response from {origin} within {read_timeout}s"
    return "connection", f"connection to {origin} failed: {reason}"


# What sending can raise: urllib3's errors, the socket's, requests' (a proxy URL it cannot
# use), and ValueError for what http.client refuses to write (its message may quote a value).
SEND_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, OSError, ValueError)
_CONNECT_FAILURES = (
    urllib3.exceptions.NewConnectionError,  # refused, unreachable, DNS (NameResolutionError)
    urllib3.exceptions.SSLError,
    urllib3.exceptions.ProxyError,
    requests.exceptions.SSLError,
    requests.exceptions.ProxyError,
)
_CONNECT_TIMEOUTS = (requests.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError)
_READ_TIMEOUTS = (requests.ReadTimeout, urllib3.exceptions.ReadTimeoutError, TimeoutError)


def is_timeout(exc: BaseException) -> bool:
    """Whether `exc`, or an error it wraps, is a connect or a read timeout."""
    return _any(_chain(exc), _CONNECT_TIMEOUTS + _READ_TIMEOUTS)


def _any(chain: list[BaseException], types: tuple[type[BaseException], ...]) -> bool:
    return any(isinstance(e, types) for e in chain)


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and every exception it wraps (requests and urllib3 nest them in args and .reason)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        nested = [*current.args, getattr(current, "reason", None)]
        nested += [current.__cause__, current.__context__]
        todo.extend(e for e in nested if isinstance(e, BaseException))
    return seen


def _reason(chain: list[BaseException], url: str) -> str:
    # The innermost error says what happened ("Connection refused"); the wrappers around it
    # repeat the URL, query and all, which may hold a key.
    root = chain[-1]
    for candidate in reversed(chain):
        if not type(candidate).__module__.startswith(("requests", "urllib3")):
            root = candidate
            break
    if isinstance(root, OSError) and root.strerror:
        text = root.strerror
    else:
        text = f"{type(root).__name__}: {root}" if str(root) else type(root).__name__
    text = text.replace(url, redact_url(url))
    query = urlsplit(url).query
    if query:
        text = text.replace(query, "***")
    return text[:MAX_ERROR_CHARS]
