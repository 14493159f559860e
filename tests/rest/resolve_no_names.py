"""gunicorn configuration (`--config python:tests.rest.resolve_no_names`) for a server under a
fuzzer: it resolves no host names but localhost. The fuzzer makes up base URLs, and creating an
API looks its host up (to refuse private addresses); those names must not reach a DNS server.
A name that does not resolve passes that check, as it would where the web server has no DNS;
the workers check every address again when they connect, and none runs in those tests."""

from __future__ import annotations

import socket
from typing import Any

_getaddrinfo = socket.getaddrinfo


def _numeric_hosts_only(
    host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
) -> Any:
    if isinstance(host, str) and host.lower() != "localhost":
        flags |= socket.AI_NUMERICHOST
    return _getaddrinfo(host, port, family, type, proto, flags)


socket.getaddrinfo = _numeric_hosts_only
