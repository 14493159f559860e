"""A grant the client holds a whole slot before its request leaves (an event loop busy with
other coroutines, a connection being opened after the grant) is given up for a new slot, so
requests held up together do not reach the API together. A real server counts the arrivals,
a real Redis grants the slots; only the hold-up between the grant and the write is staged."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio

from ratejobs.limiter import AsyncLimiter, Limiter, LimiterConfig
from ratejobs.limiter.adapters import AsyncLimitedTransport, LimitedTransport
from tests.sandbox.conftest import worst_window_excess

RATE = 20
# Arrivals come a few milliseconds after their grants, not always the same few (as in
# test_adapters): the server gets this much more burst than the bucket, a window this much slack.
JITTER_UNITS = 2
# Requests are held from their grant until the next multiple of this on the monotonic clock,
# then all written at once: six slots' worth, twice what the server's burst takes.
GATE_SECONDS = 0.3
CALLS = 40


def _until_gate() -> float:
    return GATE_SECONDS - time.monotonic() % GATE_SECONDS


class _AsyncGate(httpx.AsyncBaseTransport):
    """httpx's transport, entered only at the gate: what a stalled event loop, or connections
    opened for several requests at once, do to requests already granted."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(_until_gate())
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Gate(httpx.BaseTransport):
    """_AsyncGate for a thread's requests."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        time.sleep(_until_gate())
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def _send_async(redis_url: str, name: str, url: str) -> list[int]:
    async def run() -> list[int]:
        client = redis.asyncio.Redis.from_url(redis_url)
        limiter = AsyncLimiter(client, name)
        transport = AsyncLimitedTransport(limiter, transport=_AsyncGate())
        async with httpx.AsyncClient(transport=transport) as session:
            responses = await asyncio.gather(
                *(session.get(f"{url}/late/{i}") for i in range(CALLS))
            )
        await client.aclose()
        return [response.status_code for response in responses]

    return asyncio.run(run())


def _send_threads(redis_url: str, name: str, url: str) -> list[int]:
    limiter = Limiter(redis.Redis.from_url(redis_url), name)
    with (
        httpx.Client(transport=LimitedTransport(limiter, transport=_Gate())) as session,
        ThreadPoolExecutor(16) as pool,
    ):
        return list(pool.map(lambda i: session.get(f"{url}/late/{i}").status_code, range(CALLS)))


SENDERS: dict[str, Any] = {"asyncio": _send_async, "threads": _send_threads}


@pytest.mark.parametrize("sender", SENDERS)
def test_requests_held_up_after_their_grant_do_not_reach_the_api_together(
    make_limiter, make_sandbox, redis_url, unique_name, sender
):
    # given a server allowing 20/s one at a time (and the jitter's slack), and a bucket of 20/s
    api = make_sandbox(rate=RATE, burst=1 + JITTER_UNITS, headers="none")
    make_limiter(LimiterConfig(rate=RATE, burst=1))
    # when 40 requests wait on the bucket at once, and each is held up after its grant until
    # the next gate, so that those granted in the same 300 ms would be written together
    statuses = SENDERS[sender](redis_url, unique_name, api.url)
    # expect: each was sent once, none refused, and no stretch of the arrivals holds more than
    # the limit allows: a request held a whole slot past its grant left on a new slot
    stats = api.stats(detail=True)
    assert statuses == [200] * CALLS
    assert (stats["arrivals"], stats["throttled"]) == (CALLS, 0)
    times = sorted(entry["t"] for entry in stats["log"])
    assert worst_window_excess(times, rate=RATE, period=1, burst=1) <= JITTER_UNITS
