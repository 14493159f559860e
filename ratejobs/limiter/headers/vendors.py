"""The fields one API made up and others copied: X-RateLimit-* and X-Rate-Limit-* (GitHub,
Twitter/X, Reddit, Mastodon, Jira, and Discord with its -Reset-After, -Scope and -Global), the
per-dimension fields of OpenAI and Anthropic, Shopify's X-Shopify-Shop-Api-Call-Limit, HubSpot's
X-HubSpot-RateLimit-* and Salesforce's Sforce-Limit-Info."""

from __future__ import annotations

import re

from ratejobs.limiter.headers.hints import QuotaHint, Source, says_something
from ratejobs.limiter.headers.values import (
    DAY_SECONDS,
    DIGITS,
    UNKNOWN_RESET_PROBE_SECONDS,
    clamp,
    non_negative,
    read_count,
    read_number,
    read_remaining,
    read_reset,
)

# Shopify's REST Admin API leaks 2 requests/s on its standard plan (4, 20 and 40 on larger ones).
# Its header gives the bucket's fill, not the plan, so a full bucket waits for the slowest leak:
# on a faster plan that waits a little longer than needed, never too little.
SHOPIFY_LEAK_PER_SECOND = 2.0


def prefixed_hints(
    fields: dict[str, str],
    prefix: str,
    source: Source,
    *,
    now: float | None,
    server_now: float | None,
) -> list[QuotaHint]:
    # X-RateLimit-Limit: 5000, -Remaining: 0, -Reset: 1372700873 (GitHub, an epoch)
    # X-RateLimit-Reset-After: 1.234 (Discord: relative, so no clock to disagree about; preferred)
    # X-RateLimit-Reset as ISO 8601: Mastodon's has milliseconds or more and Z, Jira's is
    # yyyy-MM-ddTHH:mmZ (no seconds)
    reset_after = non_negative(fields.get(prefix + "reset-after"))
    if reset_after is None:
        reset_after = read_reset(fields.get(prefix + "reset"), now=now, server_now=server_now)
    else:
        reset_after = clamp(reset_after)
    policy = None
    if source == "x-ratelimit" and any(name in fields for name in _DISCORD_FIELDS):
        # Discord's limits are per route, per resource ("shared") or global; ours is one per API,
        # so whichever scope is spent blocks every call to the API, which fails closed.
        source = "discord"
        is_global = fields.get("x-ratelimit-global", "").strip().lower() == "true"
        policy = "global" if is_global else (fields.get("x-ratelimit-scope") or "").strip() or None
    hint = QuotaHint(
        limit=read_count(fields.get(prefix + "limit")),
        remaining=read_remaining(fields.get(prefix + "remaining")),
        reset_after=reset_after,
        window=None,
        source=source,
        policy=policy,
    )
    return [hint] if says_something(hint) else []


_DISCORD_FIELDS = frozenset(
    {"x-ratelimit-reset-after", "x-ratelimit-bucket", "x-ratelimit-scope", "x-ratelimit-global"}
)
# Each family's prefix (a cheap test first: every response has a dozen fields that are neither)
# and the field names that carry a dimension:
_DIMENSION_FIELDS: dict[Source, tuple[str, re.Pattern[str]]] = {
    # x-ratelimit-remaining-tokens (OpenAI; Groq and others copy it), and the dimensions OpenAI
    # adds (tokens_usage_based). Discord's x-ratelimit-reset-after is no dimension.
    "openai": (
        "x-ratelimit-",
        re.compile(r"x-ratelimit-(?P<part>limit|remaining|reset)-(?!after$)(?P<dim>.+)"),
    ),
    # anthropic-ratelimit-input-tokens-remaining, ...-requests-reset, ...-unified-reset
    "anthropic": (
        "anthropic-ratelimit-",
        re.compile(r"anthropic-ratelimit-(?P<dim>.+)-(?P<part>limit|remaining|reset)"),
    ),
}


def dimension_hints(
    fields: dict[str, str], source: Source, *, now: float | None, server_now: float | None
) -> list[QuotaHint]:
    """One hint per dimension (requests, tokens, input-tokens, ...) of a family that names the
    dimension in each field: OpenAI's and Anthropic's."""
    prefix, pattern = _DIMENSION_FIELDS[source]
    dimensions: dict[str, dict[str, str]] = {}
    for name, value in fields.items():
        if name.startswith(prefix) and (match := pattern.fullmatch(name)):
            dimensions.setdefault(match["dim"], {})[match["part"]] = value
    hints = []
    for dimension, parts in sorted(dimensions.items()):
        limit = read_number(parts.get("limit"))
        # Only a dimension that counts down is a quota (Anthropic's unified-status and the like
        # are not); Azure's OpenAI sends -1 for a limit it does not report.
        if "remaining" not in parts or (limit is not None and limit < 0):
            continue
        hint = QuotaHint(
            limit=read_count(parts.get("limit")),
            remaining=read_remaining(parts["remaining"]),
            reset_after=read_reset(parts.get("reset"), now=now, server_now=server_now),
            window=None,
            source=source,
            policy=dimension,
        )
        if says_something(hint):
            hints.append(hint)
    return hints


_USED_OF = re.compile(rf"\s*({DIGITS})\s*/\s*({DIGITS})\s*", re.ASCII)


def shopify_hints(fields: dict[str, str]) -> list[QuotaHint]:
    # X-Shopify-Shop-Api-Call-Limit: 39/40 (marbles in the bucket / its size). It leaks one request
    # at a time, so a full bucket takes one leak to admit the next request, not a whole reset.
    match = _USED_OF.fullmatch(fields.get("x-shopify-shop-api-call-limit", ""))
    if match is None:
        return []
    used, size = int(match[1]), int(match[2])
    return [
        QuotaHint(
            limit=size,
            remaining=max(0, size - used),
            reset_after=clamp(max(0, used - size + 1) / SHOPIFY_LEAK_PER_SECOND),
            window=None,
            source="shopify",
        )
    ]


def hubspot_hints(fields: dict[str, str]) -> list[QuotaHint]:
    # X-HubSpot-RateLimit-Daily / -Daily-Remaining: per day (API keys and private apps only)
    # X-HubSpot-RateLimit-Interval-Milliseconds: 10000, -Max: 100, -Remaining: 99: the burst
    # window, which HubSpot does not say the start of: a spent one waits a whole window.
    # X-HubSpot-RateLimit-Secondly / -Secondly-Remaining: per second (deprecated, still sent)
    prefix = "x-hubspot-ratelimit-"
    interval_ms = non_negative(fields.get(prefix + "interval-milliseconds"))
    interval = None if interval_ms is None else interval_ms / 1000
    windows = [
        ("daily", "daily", "daily-remaining", DAY_SECONDS, UNKNOWN_RESET_PROBE_SECONDS),
        ("interval", "max", "remaining", interval, interval),
        ("secondly", "secondly", "secondly-remaining", 1.0, 1.0),
    ]
    hints = []
    for policy, limit_name, remaining_name, window, spent_wait in windows:
        remaining = read_remaining(fields.get(prefix + remaining_name))
        if remaining is None:
            continue
        hints.append(
            QuotaHint(
                limit=read_count(fields.get(prefix + limit_name)),
                remaining=remaining,
                reset_after=clamp(spent_wait) if remaining == 0 and spent_wait else None,
                window=window,
                source="hubspot",
                policy=policy,
            )
        )
    return hints


# api-usage=25/15000; per-app-api-usage=17/250(appName=sample-connected-app)
_SALESFORCE_USAGE = re.compile(
    rf"(?:^|[;,])\s*(api-usage|per-app-api-usage)\s*=\s*({DIGITS})\s*/\s*({DIGITS})", re.ASCII
)


def salesforce_hints(fields: dict[str, str]) -> list[QuotaHint]:
    # Sforce-Limit-Info: used/limit of the org's daily API requests, counted over a rolling 24 h:
    # no header says when enough old calls leave the window, so a spent quota asks again hourly.
    hints = []
    for name, used, limit in _SALESFORCE_USAGE.findall(fields.get("sforce-limit-info", "")):
        remaining = max(0, int(limit) - int(used))
        hints.append(
            QuotaHint(
                limit=int(limit),
                remaining=remaining,
                reset_after=UNKNOWN_RESET_PROBE_SECONDS if remaining == 0 else None,
                window=DAY_SECONDS,
                source="salesforce",
                policy=name,
            )
        )
    return hints
