"""Header hints reach the limiter: a used-up quota blocks before any 429; a 429 blocks and
counts as a throttle."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest

from ratejobs.limiter import LimiterConfig, WaitTooLong


def test_used_up_quota_blocks_everyone_until_reset_before_any_429(make_limiter):
    # given a 200 whose GitHub-style headers say the quota is spent until 2 s from now
    limiter = make_limiter(LimiterConfig(rate=100))
    grant = limiter.acquire()
    now = time.time()
    headers = {
        "X-RateLimit-Limit": "60",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": str(int(now) + 3),
        "Date": formatdate(now, usegmt=True),
    }
    feedback = limiter.observe(grant, 200, headers)
    # expect: a block to the reset, not a throttle; the next caller is told to come back then
    assert feedback is not None and not feedback.accepted
    assert 1.5 < feedback.blocked_for <= 3.5
    with pytest.raises(WaitTooLong) as waited:
        limiter.acquire(max_wait=0.2)
    assert waited.value.retry_after > 1.0


def test_429_with_retry_after_blocks_for_it_and_counts_as_throttle(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, adaptive=True))
    grant = limiter.acquire()
    feedback = limiter.observe(grant, 429, {"Retry-After": "4"})
    assert feedback.accepted and feedback.rate_decreased
    assert 3.5 < feedback.blocked_for <= 4.0


@pytest.mark.slow
def test_a_403_with_a_throttle_hint_counts_as_a_throttle_as_a_429_does(make_limiter):
    # GitHub's secondary rate limit: a 403 with Retry-After. Blocking alone is not enough: the
    # throttle count, the metric and the adaptive rate must all see it.
    limiter = make_limiter(LimiterConfig(rate=100, adaptive=True))
    feedback = limiter.observe(limiter.acquire(), 403, {"Retry-After": "2"})
    assert feedback.accepted and feedback.rate_decreased
    assert 1.5 < feedback.blocked_for <= 2.0
    counts = limiter.state().counts
    assert (counts.throttles, counts.decreases) == (1, 1)
    # the batch path decides the same way
    [batched] = limiter.observe_many([(limiter.acquire(max_wait=3), 403, {"Retry-After": "1"})])
    assert batched is not None and limiter.state().counts.throttles == 2


def test_a_403_without_a_hint_is_a_refusal_not_a_throttle(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, adaptive=True))
    assert limiter.observe(limiter.acquire(), 403, {}) is None
    assert limiter.state().counts.throttles == 0


def test_429_without_hints_still_blocks_briefly(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100))
    feedback = limiter.observe(limiter.acquire(), 429, {}, default_block=0.75)
    assert 0.5 < feedback.blocked_for <= 0.75


def test_response_with_quota_left_changes_nothing(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100))
    headers = {"X-RateLimit-Remaining": "10", "X-RateLimit-Reset": "30"}
    assert limiter.observe(limiter.acquire(), 200, headers) is None
    assert limiter.state().blocked_for == 0


def test_openai_spent_tokens_block_everyone_for_their_reset_though_requests_remain(make_limiter):
    # given OpenAI's documented sample (platform.openai.com/docs/guides/rate-limits) with the
    # minute's tokens used up: requests remain, tokens come back in 6m0s
    limiter = make_limiter(LimiterConfig(rate=100))
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    feedback = limiter.observe(limiter.acquire(), 200, headers)
    # expect: a block of six minutes, not a throttle; nobody is let through meanwhile
    assert feedback is not None and not feedback.accepted
    assert 359.0 < feedback.blocked_for <= 360.0
    assert limiter.state().counts.throttles == 0
    with pytest.raises(WaitTooLong) as waited:
        limiter.acquire(max_wait=0.2)
    assert waited.value.retry_after > 359.0
