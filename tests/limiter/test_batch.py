"""Batches: acquire_many reserves several slots in one round trip and keeps every guarantee of a
single acquire (pace, block, in-flight cap, max_wait, one decrease per burst); release_many and
observe_many give leases and responses back in one round trip each.

The window bound across processes and the block across processes run the batch path through
the multi-process tests in test_pace.py and test_block.py (parametrised over the taker)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

from ratejobs.limiter import AsyncLimiter, Limiter, LimiterConfig, WaitTooLong, Window
from tests.limiter.conftest import worst_window_excess

# Time for the other thread of a test to reach its wait in Redis, on a busy 2-core machine.
SETTLE_SECONDS = 0.2


class BlockingAsyncLimiter:
    """An AsyncLimiter driven from test code on one private event loop, so a test body written
    against the sync Limiter runs unchanged on the asyncio one."""

    def __init__(self, redis_url: str, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = redis.asyncio.Redis.from_url(redis_url)
        self.limiter = AsyncLimiter(self.client, name)

    def __getattr__(self, attr: str) -> Any:
        method = getattr(self.limiter, attr)
        if not asyncio.iscoroutinefunction(method):
            return method
        return lambda *args, **kwargs: self.loop.run_until_complete(method(*args, **kwargs))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def make_batch_limiter(request, make_limiter, redis_url) -> Iterator[Callable[..., Any]]:
    """A configured limiter of the parametrised kind (its keys deleted by make_limiter)."""
    opened: list[BlockingAsyncLimiter] = []

    def make(config: LimiterConfig) -> Any:
        limiter = make_limiter(config)
        if request.param == "sync":
            return limiter
        wrapped = BlockingAsyncLimiter(redis_url, limiter.name)
        opened.append(wrapped)
        return wrapped

    yield make
    for wrapped in opened:
        wrapped.close()


def test_batch_takes_consecutive_slots_in_one_round_trip(make_batch_limiter):
    # given 100/s, burst 1: a batch of 5 is the next 5 slots, 10 ms apart, the first one now
    limiter = make_batch_limiter(LimiterConfig(rate=100, burst=1))
    before = limiter.round_trips
    batch = limiter.acquire_many(5)
    assert limiter.round_trips - before == 1
    slots = [g.slot_us for g in batch]
    assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == [10_000] * 4
    assert [g.ready for g in batch] == [True, False, False, False, False]
    assert len({g.lease_id for g in batch}) == 5
    # without an in-flight cap no slot holds a lease: nothing to give back
    assert not any(g.leased for g in batch) and limiter.state().in_flight == 0
    # expect: confirming sleeps until each slot and grants it there
    confirmed = [limiter.confirm(g) for g in batch]
    assert [g.slot_us for g in confirmed] == slots
    assert all(g.ready and g.granted_us >= g.slot_us for g in confirmed)
    assert all(g.requeued == 0 for g in confirmed)
    # and a single acquire after the batch queues behind it
    after = limiter.acquire()
    assert after.slot_us >= slots[-1] + 10_000


def test_batch_and_single_calls_share_the_window_bound(make_batch_limiter):
    # given 50/s with burst 3: batches of 4 and single acquires interleaved
    rate, burst = 50.0, 3
    limiter = make_batch_limiter(LimiterConfig(rate=rate, burst=burst))
    slots = []
    for _ in range(4):
        batch = limiter.acquire_many(4)
        slots += [limiter.confirm(g).slot_us for g in batch]
        slots.append(limiter.acquire().slot_us)
        limiter.release_many(batch)
    assert worst_window_excess(slots, [1] * len(slots), rate=rate, period=1, burst=burst) <= 0


def test_block_set_after_a_batch_stops_its_later_slots(make_batch_limiter):
    # given 10/s (a cap, so that the batch holds leases): a batch of 6 holds slots 0, 100, ...,
    # 500 ms from now
    limiter = make_batch_limiter(LimiterConfig(rate=10, burst=1, max_concurrency=10))
    batch = limiter.acquire_many(6)
    assert batch.grants[-1].slot_us - batch.now_us == 500_000
    sent = [limiter.confirm(batch.grants[0]), limiter.confirm(batch.grants[1])]
    # when a 429 elsewhere blocks the API for 0.6 s while the other 4 slots are still ahead
    block = limiter.block(0.6)
    sent += [limiter.confirm(g) for g in batch.grants[2:]]
    # expect: zero sends inside the block; the later slots went after it, under the same leases
    inside = [g for g in sent if block.now_us <= g.granted_us < block.blocked_until_us]
    assert inside == []
    assert all(g.slot_us >= block.blocked_until_us for g in sent[2:])
    assert all(g.requeued >= 1 for g in sent[2:])
    assert [g.lease_id for g in sent] == [g.lease_id for g in batch]
    assert limiter.release_many(sent) == 6


def test_a_rate_cut_after_a_batch_respaces_its_later_slots(make_limiter):
    # given adaptive 100/s: a batch of 5 reserved at 10 ms spacing, then a 429 cuts to 70/s
    limiter = make_limiter(LimiterConfig(rate=100, burst=1, adaptive=True))
    batch = limiter.acquire_many(5)
    feedback = limiter.report_throttle(limiter.confirm(batch.grants[0]))
    assert feedback.rate_decreased
    # expect: the later slots are made again, at the new spacing
    sent = [limiter.confirm(g) for g in batch.grants[1:]]
    gaps = [b.slot_us - a.slot_us for a, b in zip(sent, sent[1:], strict=False)]
    assert all(gap >= 1_000_000 / 70.5 for gap in gaps), gaps


def test_max_wait_limits_a_batch_to_the_slots_within_it(make_batch_limiter):
    # given 10/s, burst 1 (and a cap, for the leases): slots 0, 100, 200, 300 ms ... from now
    limiter = make_batch_limiter(LimiterConfig(rate=10, burst=1, max_concurrency=10))
    batch = limiter.acquire_many(5, max_wait=0.25)
    granted = time.monotonic()
    # expect: the three slots within 250 ms, and when the fourth would come
    assert len(batch) == 3
    assert batch.retry_after == pytest.approx(0.3, abs=0.01)
    assert limiter.state().in_flight == 3
    # and none at all when even the next slot is too far, with how long until it comes (the
    # same slot, nearer by the time that passed: a busy machine once took 213 ms in between)
    empty = limiter.acquire_many(4, max_wait=0.05)
    assert len(empty) == 0
    assert 0.3 - (time.monotonic() - granted) - 0.01 <= empty.retry_after <= 0.31
    assert limiter.state().in_flight == 3
    assert limiter.state().counts.too_long == 2


def test_in_flight_cap_limits_a_batch_and_release_many_frees_it_at_once(make_batch_limiter):
    # given a cap of 3 in flight
    limiter = make_batch_limiter(LimiterConfig(rate=1000, burst=10, max_concurrency=3))
    batch = limiter.acquire_many(5)
    # expect: only 3 granted, and no more until they are released
    assert len(batch) == 3
    assert batch.retry_after > 0
    started = time.monotonic()
    assert len(limiter.acquire_many(2, max_wait=0.2)) == 0
    assert time.monotonic() - started >= 0.2  # it waited for a release within max_wait
    before = limiter.round_trips
    assert limiter.release_many(batch) == 3
    assert limiter.round_trips - before == 1
    assert limiter.state().in_flight == 0
    assert limiter.release_many(batch) == 0  # already released
    assert len(limiter.acquire_many(5, max_wait=0)) == 3


def test_release_many_wakes_a_caller_waiting_for_capacity(make_limiter, redis_client):
    # given a cap of 2 held by a batch, and another worker waiting for capacity
    limiter = make_limiter(LimiterConfig(rate=1000, burst=5, max_concurrency=2))
    batch = limiter.acquire_many(2)
    other = Limiter(redis_client, limiter.name)
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(batch=other.acquire_many(2, max_wait=10)))
    waiter.start()
    time.sleep(SETTLE_SECONDS)
    assert "batch" not in got
    released_at = time.monotonic()
    limiter.release_many(batch)
    waiter.join(10)
    # expect: woken by the release (not by polling), with both slots
    assert time.monotonic() - released_at < 0.4
    assert len(got["batch"]) == 2


def test_in_flight_never_exceeds_the_cap_with_batches(make_limiter, redis_client):
    # given 6 threads, each its own limiter, taking batches of 3 under a cap of 4 and holding
    # each request 10 ms
    cap = 4
    shared = make_limiter(LimiterConfig(rate=10_000, burst=10, max_concurrency=cap))
    limiters = [Limiter(redis_client, shared.name) for _ in range(6)]
    lock, in_flight, worst, errors = threading.Lock(), [0], [0], []

    def caller(limiter: Limiter) -> None:
        try:
            for _ in range(6):
                batch = limiter.acquire_many(3, max_wait=30)
                with lock:
                    in_flight[0] += len(batch)
                    worst[0] = max(worst[0], in_flight[0])
                for grant in batch:
                    limiter.confirm(grant)
                    time.sleep(0.01)
                with lock:
                    in_flight[0] -= len(batch)
                limiter.release_many(batch)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(lim,)) for lim in limiters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert worst[0] == cap
    assert shared.state().in_flight == 0


def test_a_batch_of_429s_fed_back_together_cuts_the_rate_once(make_batch_limiter):
    # given ten requests granted in one batch, all answered 429
    limiter = make_batch_limiter(LimiterConfig(rate=100, burst=10, adaptive=True))
    batch = limiter.acquire_many(10)
    assert all(g.ready for g in batch)
    before = limiter.round_trips
    results = limiter.observe_many([(g, 429, {"Retry-After": "1"}) for g in batch])
    # expect: one round trip, one accepted throttle and one cut (x0.7), nine ignored, one block
    assert limiter.round_trips - before == 1
    assert [r.accepted for r in results] == [True] + [False] * 9
    assert results[0].rate_after == pytest.approx(70, rel=1e-3)
    assert all(r.rate_after == pytest.approx(70, rel=1e-3) for r in results)
    state = limiter.state()
    assert state.counts.decreases == 1
    assert state.counts.throttles == 10
    assert state.blocked_for > 0.9
    # and a second round of the same burst's responses changes nothing more
    again = limiter.observe_many([(g, 429, {}) for g in batch])
    assert not any(r.accepted for r in again)
    assert limiter.state().counts.decreases == 1


def test_observe_many_skips_responses_that_say_nothing(make_batch_limiter):
    limiter = make_batch_limiter(LimiterConfig(rate=100, burst=5, adaptive=True))
    batch = limiter.acquire_many(3)
    before = limiter.round_trips
    assert limiter.observe_many([(g, 200, {}) for g in batch]) == [None, None, None]
    assert limiter.round_trips == before  # nothing to say: no round trip
    mixed = limiter.observe_many([(batch.grants[0], 200, {}), (batch.grants[1], 429, {})])
    assert mixed[0] is None
    assert mixed[1].accepted


def test_confirm_past_max_wait_gives_the_lease_back(make_limiter):
    # given a reserved slot, then a block far longer than the caller will wait
    limiter = make_limiter(LimiterConfig(rate=10, burst=1, max_concurrency=5))
    batch = limiter.acquire_many(2)
    limiter.block(30)
    with pytest.raises(WaitTooLong):
        limiter.confirm(batch.grants[1], max_wait=0.5)
    # expect: that lease is free again; the first (ready before the block) is still held
    assert limiter.state().in_flight == 1


@pytest.mark.parametrize("shrunk", ["cost", "weight"])
def test_confirm_refused_by_shrunk_limits_gives_the_lease_back(make_batch_limiter, shrunk):
    # given an in-flight cap of 2 and a reserved slot still to come, of weight 2 and cost 80;
    # then limits shrunk below what that reservation holds (a cost window's burst, or the
    # burst), so that its confirm can only refuse it
    def limits(burst: int, cost_burst: int) -> LimiterConfig:
        window = Window(1000.0, 1.0, cost_burst, "cost")
        return LimiterConfig(rate=10, burst=burst, max_concurrency=2, windows=(window,))

    limiter = make_batch_limiter(limits(burst=2, cost_burst=200))
    batch = limiter.acquire_many(2, weight=2, costs=[10, 80])
    assert not batch.grants[1].ready
    limiter.configure(limits(burst=2, cost_burst=50) if shrunk == "cost" else limits(1, 200))
    with pytest.raises(ValueError, match="exceeds"):
        limiter.confirm(batch.grants[1])
    # expect: its in-flight place is free at once, not when its lease expires; the first
    # grant's is still held
    assert limiter.state().in_flight == 1


def test_batch_arguments_are_checked(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=10, burst=2))
    for count in (0, -1, 1001, True, 2.0):
        with pytest.raises(ValueError, match="count"):
            limiter.acquire_many(count)
    with pytest.raises(ValueError, match="exceeds burst"):
        limiter.acquire_many(2, weight=3)
    assert limiter.release_many([]) == 0
