"""asyncio and sync callers share one limiter: one pace, one block."""

from __future__ import annotations

import asyncio
import threading

import redis.asyncio

from ratejobs.limiter import AsyncLimiter, LimiterConfig
from tests.limiter.conftest import worst_window_excess


def test_async_and_sync_callers_share_one_bucket(make_limiter, redis_url):
    # given 50/s with burst 2: 3 sync threads and 3 asyncio tasks take grants together
    rate, burst = 50.0, 2
    sync_limiter = make_limiter(LimiterConfig(rate=rate, burst=burst))
    sync_slots: list[int] = []

    def sync_caller() -> None:
        for _ in range(10):
            with sync_limiter.slot() as grant:
                sync_slots.append(grant.slot_us)

    async def async_callers() -> list[int]:
        client = redis.asyncio.Redis.from_url(redis_url)
        limiter = AsyncLimiter(client, sync_limiter.name)
        slots: list[int] = []

        async def one() -> None:
            for _ in range(10):
                async with limiter.slot() as grant:
                    slots.append(grant.slot_us)

        await asyncio.gather(*(one() for _ in range(3)))
        await client.aclose()
        return slots

    threads = [threading.Thread(target=sync_caller) for _ in range(3)]
    for t in threads:
        t.start()
    async_slots = asyncio.run(async_callers())
    for t in threads:
        t.join(30)
    # expect: both kinds were served and the combined grants keep the bound
    assert len(sync_slots) == len(async_slots) == 30
    slots = sync_slots + async_slots
    assert worst_window_excess(slots, [1] * len(slots), rate=rate, period=1, burst=burst) <= 0


def test_block_from_sync_side_stops_async_callers(make_limiter, redis_url):
    sync_limiter = make_limiter(LimiterConfig(rate=100, burst=1))
    block = sync_limiter.block(0.5)

    async def take() -> int:
        client = redis.asyncio.Redis.from_url(redis_url)
        grant = await AsyncLimiter(client, sync_limiter.name).acquire()
        await client.aclose()
        return grant.granted_us

    assert asyncio.run(take()) >= block.blocked_until_us


def test_cancelled_async_waiter_gives_its_lease_back(make_limiter, redis_url):
    sync_limiter = make_limiter(LimiterConfig(rate=1, period=10, max_concurrency=5))
    sync_limiter.acquire()

    async def cancel_a_waiter() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        limiter = AsyncLimiter(client, sync_limiter.name)
        task = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0.2)
        assert (await limiter.state()).in_flight == 2
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert (await limiter.state()).in_flight == 1
        await client.aclose()

    asyncio.run(cancel_a_waiter())
