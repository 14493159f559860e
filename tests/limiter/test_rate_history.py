"""The limiter samples its own rate for the operator's chart: at most one sample per 2 s while
granting, a cut by a 429 at once (as a step), the newest samples only, forgotten by a reset."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
import redis.asyncio

from ratejobs.limiter import AsyncLimiter, Limiter, LimiterConfig, RateSample
from ratejobs.limiter.core import RATE_SAMPLE_SECONDS

ADAPTIVE = LimiterConfig(rate=200, burst=10, adaptive=True, decrease_factor=0.7)


@pytest.fixture
def limiter_keeping(redis_client, unique_name) -> Iterator[Callable[[int], Limiter]]:
    """A limiter under this test's name keeping at most `kept` samples; its keys are deleted
    afterwards."""
    made: list[Limiter] = []

    def make(kept: int) -> Limiter:
        limiter = Limiter(redis_client, unique_name, ADAPTIVE, rate_samples_kept=kept)
        limiter.configure(ADAPTIVE)
        made.append(limiter)
        return limiter

    yield make
    for limiter in made:
        redis_client.delete(*limiter.keys)


@pytest.mark.slow
def test_granting_samples_the_rate_at_most_once_per_two_seconds(make_limiter):
    # given 4.3 s of grants, one by one and in batches, at 200/s
    limiter = make_limiter(ADAPTIVE)
    started = time.time()
    while time.time() - started < 4.3:
        limiter.release(limiter.acquire())
        batch = limiter.acquire_many(5, max_wait=1)
        limiter.release_many([limiter.confirm(grant) for grant in batch])
    history = limiter.rate_history()
    # expect: the first grant, then one 2 s later and one 4 s later, no more
    assert len(history) == 3
    gaps = [later.at - earlier.at for earlier, later in zip(history, history[1:], strict=False)]
    assert all(RATE_SAMPLE_SECONDS <= gap < RATE_SAMPLE_SECONDS + 0.5 for gap in gaps), gaps
    assert started - 0.5 < history[0].at < started + 0.5
    assert history[0].grants == 1
    assert history[0].grants < history[1].grants < history[2].grants
    assert history[2].grants <= limiter.state().counts.grants
    # the difference of two samples is the grants between them: about 2 s at 200/s
    assert 300 < history[2].grants - history[1].grants <= 2 * 200 + 10
    assert {(s.rate, s.period, s.rate_per_second) for s in history} == {(200.0, 1.0, 200.0)}


def test_a_cut_by_a_429_is_sampled_at_once_as_a_step(make_limiter):
    limiter = make_limiter(ADAPTIVE)
    grant = limiter.acquire()  # the first grant: one sample
    # given a 429 well within 2 s of that sample
    feedback = limiter.observe(grant, 429, {"Retry-After": "0"})
    assert feedback is not None and feedback.rate_decreased
    first, before, after = limiter.rate_history()
    # expect: the rate just before the cut and just after it, 1 µs apart
    assert before.rate == pytest.approx(feedback.rate_before)
    assert after.rate == pytest.approx(feedback.rate_after) == pytest.approx(200 * 0.7)
    assert round((after.at - before.at) * 1_000_000) == 1
    assert first.at < before.at
    # a 429 of the same burst (about the older generation) cuts nothing and adds nothing
    assert not limiter.observe(grant, 429, {"Retry-After": "0"}).accepted
    assert len(limiter.rate_history()) == 3
    # several cuts reported together make one step: from before the first to after the last
    results = limiter.observe_many([(None, 429, {}), (None, 429, {})])
    step = limiter.rate_history()[3:]
    assert [s.rate for s in step] == pytest.approx([results[0].rate_before, results[1].rate_after])


def test_the_history_keeps_only_its_newest_samples(limiter_keeping):
    # given a history of 3 samples at most, and four cuts (two samples each)
    limiter = limiter_keeping(3)
    cuts = [limiter.report_throttle(None) for _ in range(4)]
    history = limiter.rate_history()
    # expect: the newest three: after the third cut, before and after the last one
    expected = [cuts[2].rate_after, cuts[3].rate_before, cuts[3].rate_after]
    assert [s.rate for s in history] == pytest.approx(expected)


def test_since_reads_the_recent_samples_and_a_reset_forgets_them_all(make_limiter):
    limiter = make_limiter(ADAPTIVE)
    limiter.acquire()
    limiter.report_throttle(None)
    history = limiter.rate_history()
    assert limiter.rate_history(since=history[1].at) == history[1:]
    assert limiter.rate_history(since=history[-1].at + 0.001) == []
    limiter.reset()
    assert limiter.rate_history() == []
    assert limiter.state().configured  # the configuration stays, as a reset keeps it
    # and sampling starts again at the next grant
    limiter.acquire()
    assert len(limiter.rate_history()) == 1


def test_the_asyncio_limiter_reads_the_same_history(make_limiter, redis_url):
    limiter = make_limiter(ADAPTIVE)
    limiter.acquire()

    async def read() -> list[RateSample]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            return await AsyncLimiter(client, limiter.name).rate_history()
        finally:
            await client.aclose()

    assert asyncio.run(read()) == limiter.rate_history() != []
