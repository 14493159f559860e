"""End to end through a sandbox speaking OpenAI's, Anthropic's or Shopify's quota headers: the
limiter, fed each response, stops every request from the moment the headers say the quota is
spent until the reset they announce, so the API never has to answer 429."""

from __future__ import annotations

import time

import pytest
import requests

from ratejobs.limiter import LimiterConfig
from ratejobs.limiter.headers import parse_quota

# The sandbox advertises (and enforces) 5 requests/s with a burst of 5; the limiter is set to ten
# times that, so only the headers can keep the client inside the quota. Shopify's header says how
# full the bucket is, not how fast it leaks: the sandbox leaks at the 2/s the parser assumes.
ADVERTISED = {
    "openai": {"rate": 5.0, "period": 1.0, "burst": 5},
    "anthropic": {"rate": 5.0, "period": 1.0, "burst": 5},
    "shopify": {"rate": 2.0, "period": 1.0, "burst": 4},
}
LIMITER_RATE = 50.0
RUN_SECONDS = 4.0
# The sandbox logs arrivals on its own process's reading of the wall clock; the two readings of
# one clock differ by microseconds, this allows for it at either end of a window.
CLOCK_SLACK_S = 0.002
ACQUIRE_MAX_WAIT_S = 10.0  # longer than any reset the sandbox announces (about 2 s)


@pytest.mark.slow
@pytest.mark.parametrize("dialect", sorted(ADVERTISED))
def test_spent_quota_headers_keep_every_request_out_of_the_announced_reset(
    dialect, make_limiter, sandbox
):
    server = sandbox(**ADVERTISED[dialect], headers=dialect)
    limiter = make_limiter(LimiterConfig(rate=LIMITER_RATE, burst=ADVERTISED[dialect]["burst"]))
    spent: list[tuple[float, float]] = []  # (response received, announced reset in seconds)
    statuses: list[int] = []
    with requests.Session() as session:
        session.trust_env = False  # straight to the sandbox, whatever proxy the environment names
        deadline = time.monotonic() + RUN_SECONDS
        while time.monotonic() < deadline:
            grant = limiter.acquire(max_wait=ACQUIRE_MAX_WAIT_S)
            try:
                response = session.get(f"{server.url}/items", timeout=10)
                received = time.time()
                statuses.append(response.status_code)
                hint = parse_quota(response.headers, now=received)
                assert hint is not None and hint.source == dialect
                if hint.exhausted:
                    spent.append((received, hint.reset_after))
                limiter.observe(grant, response.status_code, response.headers)
            finally:
                limiter.release(grant)

    stats = server.stats(detail=True)
    arrivals = [entry["t"] for entry in stats["log"]]
    # expect: the quota was spent more than once (so the invariant was put to the test; the
    # Anthropic resets are whole seconds after a Date of whole seconds, about 2 s each)...
    assert len(spent) >= 2, spent
    # ...not one request arrived inside a reset window announced before it...
    inside = [
        (t, received, reset)
        for received, reset in spent
        for t in arrivals
        if received + CLOCK_SLACK_S < t < received + reset - CLOCK_SLACK_S
    ]
    assert inside == []
    # ...and the API never had to refuse one, though the limiter alone allows ten times more.
    assert set(statuses) == {200}
    assert (stats["throttled"], stats["retry_after_violations"]) == (0, 0)
    assert len(arrivals) == len(statuses)
