"""What a response says about a quota, whichever header family said it: a QuotaHint, and the
Source that names the family."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Source = Literal[
    "ratelimit",  # IETF draft-08 and later: RateLimit: "name";r=..;t=.. (+ RateLimit-Policy)
    "ratelimit-dict",  # IETF draft-07: RateLimit: limit=.., remaining=.., reset=..
    "ratelimit-fields",  # IETF drafts up to 06, GitLab: RateLimit-Limit/-Remaining/-Reset
    "x-ratelimit",  # GitHub, Discord, Reddit, ...: X-RateLimit-Limit/-Remaining/-Reset
    "x-rate-limit",  # Twitter/X and others: X-Rate-Limit-Limit/-Remaining/-Reset
    "discord",  # X-RateLimit-* plus -Reset-After, -Bucket, -Scope and -Global
    "openai",  # x-ratelimit-{limit,remaining,reset}-{requests,tokens}; resets as "6m0s"
    "anthropic",  # anthropic-ratelimit-{requests,tokens,...}-{limit,remaining,reset}; RFC 3339
    "shopify",  # X-Shopify-Shop-Api-Call-Limit: 39/40, a leaky bucket
    "hubspot",  # X-HubSpot-RateLimit-{Daily,Max,Secondly,...}
    "salesforce",  # Sforce-Limit-Info: api-usage=25/15000, a daily quota
]


@dataclass(frozen=True)
class QuotaHint:
    """What a response says about the quota it was counted against."""

    limit: int | None
    remaining: int | None  # never negative; an overdrawn quota reads 0
    # Seconds from now until the quota refills, 0..MAX_DELAY_SECONDS: for a leaky bucket until
    # it takes one more request, for a spent quota that never says when UNKNOWN_RESET_PROBE_SECONDS.
    reset_after: float | None
    window: float | None  # seconds, when a policy names one
    source: Source
    # What the numbers count: the IETF policy's name, a dimension ("requests", "tokens",
    # "input-tokens", "daily", "api-usage") or Discord's scope ("user", "shared", "global").
    policy: str | None = None

    @property
    def exhausted(self) -> bool:
        return self.remaining is not None and self.remaining <= 0


def says_something(hint: QuotaHint) -> bool:
    """Whether a hint gives a limit, a remaining count or a reset: a family whose fields are all
    absent or garbage gives none."""
    return any(v is not None for v in (hint.limit, hint.remaining, hint.reset_after))
