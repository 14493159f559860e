"""The IETF RateLimit fields: the structured fields of draft-08 and later (RateLimit and
RateLimit-Policy, parsed by http-sf), the dictionary of draft-07, and the separate
RateLimit-Limit, -Remaining and -Reset of the earlier drafts and GitLab."""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Literal

import http_sf

from ratejobs.limiter.headers.hints import QuotaHint, says_something
from ratejobs.limiter.headers.values import read_remaining, read_reset, reset_from_number


def structured_hints(
    fields: dict[str, str], *, now: float | None, server_now: float | None
) -> list[QuotaHint]:
    # RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400
    # RateLimit: "burst";r=0;t=30
    policies = {
        str(name): params
        for name, params in _sf(fields.get("ratelimit-policy"), "list")
        if isinstance(name, _NAME)
    }
    hints = []
    for name, params in _sf(fields.get("ratelimit"), "list"):
        if not isinstance(name, _NAME) or "r" not in params:
            continue
        policy = policies.get(str(name), {})
        hints.append(
            QuotaHint(
                limit=_sf_count(policy.get("q")),
                remaining=_sf_remaining(params.get("r")),
                reset_after=_sf_reset(params.get("t"), now=now, server_now=server_now),
                window=_sf_seconds(policy.get("w")),
                source="ratelimit",
                policy=str(name),
            )
        )
    if hints or "ratelimit" in fields:
        return hints
    # Policies alone still say what the quota is, if not how much of it is left.
    return [
        QuotaHint(
            limit=_sf_count(params.get("q")),
            remaining=None,
            reset_after=None,
            window=_sf_seconds(params.get("w")),
            source="ratelimit",
            policy=name,
        )
        for name, params in policies.items()
    ]


def dictionary_hints(
    fields: dict[str, str], *, now: float | None, server_now: float | None
) -> list[QuotaHint]:
    # RateLimit: limit=100, remaining=0, reset=30
    # RateLimit-Policy: 10;w=1, 100;w=60
    members = _sf(fields.get("ratelimit"), "dictionary")
    if not members.keys() & {"limit", "remaining", "reset"}:
        return []
    limit = _sf_count(members.get("limit", (None, {}))[0])
    return [
        QuotaHint(
            limit=limit,
            remaining=_sf_remaining(members.get("remaining", (None, {}))[0]),
            reset_after=_sf_reset(
                members.get("reset", (None, {}))[0], now=now, server_now=server_now
            ),
            window=_window_for(limit, _sf(fields.get("ratelimit-policy"), "list")),
            source="ratelimit-dict",
        )
    ]


def separate_field_hints(
    fields: dict[str, str], *, now: float | None, server_now: float | None
) -> list[QuotaHint]:
    # RateLimit-Limit: 100     (drafts 00-06 may add policies: "100, 100;w=60")
    # RateLimit-Remaining: 0
    # RateLimit-Reset: 30      (GitLab sends an epoch here; reset_from_number tells them apart)
    limit_members = _sf(fields.get("ratelimit-limit"), "list")
    limit = _sf_count(limit_members[0][0]) if limit_members else None
    hint = QuotaHint(
        limit=limit,
        remaining=read_remaining(fields.get("ratelimit-remaining")),
        reset_after=read_reset(fields.get("ratelimit-reset"), now=now, server_now=server_now),
        window=_window_for(limit, [*limit_members, *_sf(fields.get("ratelimit-policy"), "list")]),
        source="ratelimit-fields",
    )
    return [hint] if says_something(hint) else []


def _window_for(limit: int | None, policies: Iterable[_Member]) -> float | None:
    """The window of the integer policy item whose quota is `limit` ("100;w=60")."""
    for quota, params in policies:
        if limit is not None and _sf_count(quota) == limit and "w" in params:
            return _sf_seconds(params["w"])
    return None


# --- Structured fields (RFC 9651), parsed by http-sf -----------------------------------------

_Member = tuple[Any, dict[str, Any]]  # (bare item or inner list, parameters)
_NAME = (str, http_sf.Token)  # a policy name is an sf-string, or an sf-token from lax servers


def _sf(value: str | None, tltype: Literal["list", "dictionary"]) -> Any:
    """The members of a structured field; none when it is absent or does not parse (the RFC
    discards a field that fails to parse as a whole, and one with non-ASCII in it cannot)."""
    try:
        return http_sf.parse((value or "").strip(" \t").encode("ascii"), tltype=tltype)
    except ValueError:  # http_sf.StructuredFieldError or UnicodeEncodeError
        return [] if tltype == "list" else {}


def _sf_number(value: object) -> float | None:
    # bool is an int to Python, but ?1 is not a count of anything. Decimals arrive as Decimal.
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        return None
    return float(value)


def _sf_count(value: object) -> int | None:
    number = _sf_number(value)
    return None if number is None or number < 0 else int(number)


def _sf_remaining(value: object) -> int | None:
    number = _sf_number(value)
    return None if number is None else max(0, math.floor(number))


def _sf_seconds(value: object) -> float | None:
    number = _sf_number(value)
    return None if number is None or number < 0 else number


def _sf_reset(value: object, *, now: float | None, server_now: float | None) -> float | None:
    seconds = _sf_seconds(value)
    return None if seconds is None else reset_from_number(seconds, now=now, server_now=server_now)
