"""The request of one call, and how to build one that cannot leave its API or lose its
credentials."""

from __future__ import annotations

import json as jsonlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ratejobs.execution.targets import (
    Query,
    check_header_syntax,
    check_headers,
    redact_url,
    resolve_url,
    validate_base_url,
    validate_method,
)

MASK = "***"
_NO_JSON: Any = object()


@dataclass(frozen=True, repr=False)
class HttpRequest:
    """What to send. Header values may hold credentials, so the repr masks them all (and the
    URL's query values, where some APIs take their key).

    `credential_headers` (lower-cased) name the headers that carry the API's credentials, and
    `base_url` is where they may go: a redirect outside it is followed without them. Without a
    base_url, the URL's origin is the scope."""

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None
    credential_headers: frozenset[str] = frozenset()
    base_url: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", validate_method(self.method))
        # A private copy: the caller's dict changing later must not change what is sent.
        object.__setattr__(self, "headers", dict(self.headers))
        check_header_syntax(self.headers)
        names = frozenset(name.lower() for name in self.credential_headers)
        object.__setattr__(self, "credential_headers", names)
        if self.body is not None and not isinstance(self.body, bytes):
            raise ValueError("body must be bytes or None")

    def __repr__(self) -> str:
        headers = {name: MASK for name in self.headers}
        body = "None" if self.body is None else f"<{len(self.body)} bytes>"
        return (
            f"HttpRequest(method={self.method!r}, url={redact_url(self.url)!r}, "
            f"headers={headers!r}, body={body})"
        )

    __str__ = __repr__


def merge_headers(defaults: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """`defaults` (an API's default headers) under `own` (a call's): names compare without
    case, so a call's "accept" replaces the API's "Accept" rather than sending both."""
    overridden = {name.lower() for name in own}
    merged = {name: value for name, value in defaults.items() if name.lower() not in overridden}
    merged.update(own)
    return merged


def build_request(
    *,
    method: str,
    base_url: str,
    path: str,
    query: Query | None = None,
    headers: Mapping[str, str] | None = None,
    body: bytes | str | None = None,
    json: Any = _NO_JSON,
    credentials: Mapping[str, str] | None = None,
) -> HttpRequest:
    """A checked request for `path` under `base_url`.

    `headers` are the call's own and may not name a credential header (Authorization, or any
    name in `credentials`) nor one the HTTP client owns; `credentials` (e.g.
    {"Authorization": "Bearer ..."} or {"X-Api-Key": "..."}) are added last. `json` is encoded
    and sets Content-Type unless the headers set one; give `body` or `json`, not both.
    """
    own = dict(headers or {})
    creds = dict(credentials or {})
    check_headers(own, protected=set(creds))
    if json is not _NO_JSON:
        if body:  # an empty body (a blank form field) is no body
            raise ValueError("give body or json, not both")
        body = jsonlib.dumps(json, separators=(",", ":")).encode()
        if not any(name.lower() == "content-type" for name in own):
            own["Content-Type"] = "application/json"
    if isinstance(body, str):
        body = body.encode()
    return HttpRequest(
        method=method,
        url=resolve_url(base_url, path, query),
        headers={**own, **creds},
        body=body,
        credential_headers=frozenset(creds),
        base_url=validate_base_url(base_url),
    )
