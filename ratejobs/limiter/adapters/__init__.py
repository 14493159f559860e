"""The shared limiter around the HTTP clients people already use, one line each:

- requests: `session.mount(base_url, LimitedAdapter(limiter))`;
- httpx: `httpx.Client(transport=LimitedTransport(limiter))`, and
  `httpx.AsyncClient(transport=AsyncLimitedTransport(limiter))` with an AsyncLimiter;
- aiohttp: `aiohttp.ClientSession(middlewares=(LimitedMiddleware(limiter),))` with an
  AsyncLimiter.

Each request takes a slot of the shared bucket first (WaitTooLong past max_wait), its response
is fed back to it (429s, Retry-After and every header dialect ratejobs reads, for every client
of the bucket at once), its real cost is settled from the API's cost header or JSON field, and
its in-flight lease goes back when the response is done, a streamed body included. docs/client.md
shows them. Each adapter imports only its own client library, when it is first named here.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "LimitedAdapter": "ratejobs.limiter.adapters.for_requests",
    "LimitedTransport": "ratejobs.limiter.adapters.for_httpx",
    "AsyncLimitedTransport": "ratejobs.limiter.adapters.for_httpx",
    "LimitedMiddleware": "ratejobs.limiter.adapters.for_aiohttp",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
