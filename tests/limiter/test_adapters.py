"""The adapters (requests, httpx, httpx with asyncio, aiohttp) through a real server and a real
Redis: a slot before each request, 429s and Retry-After shared by every client of the bucket, the
header dialects, the real cost, the lease back when a streamed body ends, WaitTooLong."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
import redis
import redis.asyncio
import requests

from ratejobs.limiter import AsyncLimiter, LimiterConfig, WaitTooLong, Window
from ratejobs.limiter.adapters import (
    AsyncLimitedTransport,
    LimitedAdapter,
    LimitedMiddleware,
    LimitedTransport,
)
from tests.sandbox.conftest import worst_window_excess


class _Loop:
    """An event loop on a thread of its own, so the async adapter is driven like the others."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Client:
    """One HTTP client with the adapter of its kind, on the limiter named `name`: get() answers
    (status, body), stream() opens a response whose body is read or closed later."""

    def __init__(self, kind: str, redis_url: str, name: str, base: str, **options: Any) -> None:
        self.kind = kind
        if kind == "requests":
            from ratejobs.limiter import Limiter

            self.limiter = Limiter(redis.Redis.from_url(redis_url), name)
            self.session = requests.Session()
            self.session.trust_env = False
            self.session.mount(base, LimitedAdapter(self.limiter, **options))
        elif kind == "httpx":
            from ratejobs.limiter import Limiter

            self.limiter = Limiter(redis.Redis.from_url(redis_url), name)
            self.session = httpx.Client(transport=LimitedTransport(self.limiter, **options))
        else:
            self.aio = _Loop()

            async def make() -> Any:
                self.limiter = AsyncLimiter(redis.asyncio.Redis.from_url(redis_url), name)
                if kind == "aiohttp":
                    middleware = LimitedMiddleware(self.limiter, **options)
                    return aiohttp.ClientSession(middlewares=(middleware,))
                return httpx.AsyncClient(transport=AsyncLimitedTransport(self.limiter, **options))

            self.session = self.aio.run(make())

    def get(self, url: str) -> tuple[int, bytes]:
        if self.kind == "requests":
            response = self.session.get(url)
            return response.status_code, response.content
        if self.kind == "httpx":
            response = self.session.get(url)
            return response.status_code, response.content

        async def get() -> tuple[int, bytes]:
            if self.kind == "aiohttp":
                async with self.session.get(url) as response:
                    return response.status, await response.read()
            response = await self.session.get(url)
            return response.status_code, response.content

        return self.aio.run(get())

    def stream(self, url: str) -> Any:
        """A response whose body is not read yet: .read() reads it to its end, .close() drops it."""
        if self.kind == "requests":
            response = self.session.get(url, stream=True)
            return _Opened(lambda: b"".join(response.iter_content(8192)), response.close)
        if self.kind == "httpx":
            response = self.session.send(self.session.build_request("GET", url), stream=True)
            return _Opened(lambda: b"".join(response.iter_bytes()), response.close)

        if self.kind == "aiohttp":
            opened = self.aio.run(self.session.get(url))

            async def read_all() -> bytes:
                return b"".join([chunk async for chunk in opened.content.iter_chunked(8192)])

            async def close_unread() -> None:
                opened.close()

            return _Opened(lambda: self.aio.run(read_all()), lambda: self.aio.run(close_unread()))

        async def open_() -> httpx.Response:
            request = self.session.build_request("GET", url)
            return await self.session.send(request, stream=True)

        response = self.aio.run(open_())

        async def read() -> bytes:
            return b"".join([chunk async for chunk in response.aiter_bytes()])

        return _Opened(lambda: self.aio.run(read()), lambda: self.aio.run(response.aclose()))

    def close(self) -> None:
        if self.kind in ("async-httpx", "aiohttp"):
            closing = self.session.close() if self.kind == "aiohttp" else self.session.aclose()
            self.aio.run(closing)
            self.aio.run(self.limiter.client.aclose())
            self.aio.stop()
        else:
            self.session.close()
            self.limiter.client.close()


class _Opened:
    def __init__(self, read: Any, close: Any) -> None:
        self.read, self.close = read, close


KINDS = ["requests", "httpx", "async-httpx", "aiohttp"]


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def clients(kind, redis_url, unique_name) -> Iterator[Any]:
    made: list[Client] = []

    def make(base: str, **options: Any) -> Client:
        client = Client(kind, redis_url, unique_name, base, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


# Arrivals come a few milliseconds after their grants, not always the same few, more so on a
# loaded machine: the server gets this much more burst than the bucket, a window this much slack.
JITTER_UNITS = 2


def test_every_request_takes_a_slot_of_the_shared_bucket(make_limiter, clients, make_sandbox):
    # given a server allowing 20/s, one at a time, and a bucket of the same limit
    api = make_sandbox(rate=20, burst=1 + JITTER_UNITS, headers="none")
    make_limiter(LimiterConfig(rate=20.0, burst=1))
    # when two clients of the bucket send 15 requests each, at once
    first, second = clients(api.url), clients(api.url)
    threads = [
        threading.Thread(target=lambda c=c: [c.get(f"{api.url}/items/{i}") for i in range(15)])
        for c in (first, second)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # expect: all arrived, none refused, no stretch over the limit
    stats = api.stats(detail=True)
    assert (stats["arrivals"], stats["throttled"]) == (30, 0)
    times = sorted(entry["t"] for entry in stats["log"])
    assert worst_window_excess(times, rate=20, period=1, burst=1) <= JITTER_UNITS


def test_a_429_blocks_every_client_until_its_retry_after(make_limiter, clients, make_sandbox):
    # given a server whose real limit (2 per 2 s) is far under what the bucket allows (2/s):
    # only its 429 and Retry-After can stop the clients. (The bucket's slots lie 500 ms apart,
    # time enough for a 429 to be fed back before the next slot, even on a busy machine: a
    # request already granted when the 429 came would be on its way, and no client can call
    # it back. At 250 ms apart, one request in one CI run of many left inside the block.)
    api = make_sandbox(rate=1, period=2, burst=2, headers="none")
    limiter = make_limiter(LimiterConfig(rate=2.0, burst=1))
    first, second = clients(api.url, retries=3), clients(api.url, retries=3)
    # when both send until each has its answers
    results: list[int] = []
    threads = [
        threading.Thread(
            target=lambda c=c: results.extend(c.get(f"{api.url}/x/{i}")[0] for i in range(3))
        )
        for c in (first, second)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # expect: every request got its 200 in the end, after the shared block, and no request of
    # either client arrived while a Retry-After the server sent was running
    stats = api.stats()
    assert results == [200] * 6
    assert stats["throttled"] >= 1
    assert stats["retry_after_violations"] == 0
    assert limiter.state().counts.throttles >= 1


@pytest.mark.parametrize("dialect", ["github", "ietf", "openai", "anthropic", "shopify"])
def test_a_spent_quota_in_any_dialect_blocks_before_the_429(
    make_limiter, clients, make_sandbox, dialect
):
    # given a server advertising a quota of 4 per 2 s in its headers, and a bucket allowing far
    # more: only the headers tell the clients to stop
    api = make_sandbox(rate=2, period=2, burst=4, headers=dialect)
    limiter = make_limiter(LimiterConfig(rate=100.0, burst=1))
    client = clients(api.url)
    # when the quota is spent
    for i in range(4):
        assert client.get(f"{api.url}/q/{i}")[0] == 200
    # expect: the bucket is blocked until the quota's reset, before any 429
    assert limiter.state().blocked_for > 0
    assert api.stats()["throttled"] == 0


@pytest.mark.parametrize("source", ["header", "json"])
def test_the_real_cost_is_settled_from_the_response(make_limiter, clients, make_sandbox, source):
    # given a token window of 1,000 and requests estimated at 100 that use 30
    api = make_sandbox(
        rate=100, burst=10, headers="none", token_rate=10_000, token_period=1, token_burst=10_000
    )
    limiter = make_limiter(
        LimiterConfig(rate=100.0, burst=10, windows=(Window(1000.0, 3600.0, 1000, "cost"),))
    )
    where = {"cost_header": "X-Tokens-Used"} if source == "header" else {}
    where |= {"cost_json_field": "usage.total_tokens"} if source == "json" else {}
    client = clients(api.url, cost=100, **where)
    # when five are answered
    for i in range(5):
        assert client.get(f"{api.url}/t/{i}?tokens=30")[0] == 200
    # expect: the window holds what they used, not what they were estimated at
    (window,) = limiter.state().windows
    assert 1000 - window.remaining == pytest.approx(5 * 30, abs=2)


def test_a_streamed_response_holds_its_place_until_its_body_ends(
    make_limiter, clients, make_sandbox
):
    # given an API with one place in flight
    api = make_sandbox(rate=1000, burst=100, headers="none")
    make_limiter(LimiterConfig(rate=1000.0, burst=10, max_concurrency=1))
    client, other = clients(api.url), clients(api.url, max_wait=0.2)
    # when a large body (more than any client and socket buffer ahead of the reader: aiohttp
    # gives the place back once the whole body has arrived) is opened and not yet read, the
    # place is taken
    opened = client.stream(f"{api.url}/big?bytes=8000000")
    with pytest.raises(WaitTooLong):
        other.get(f"{api.url}/second")
    # and once it is read to its end, the place is free again
    assert len(opened.read()) == 8_000_000
    assert other.get(f"{api.url}/second")[0] == 200
    # the same when a streamed response is closed unread
    opened = client.stream(f"{api.url}/big?bytes=8000000")
    opened.close()
    assert other.get(f"{api.url}/third")[0] == 200


def test_a_request_that_would_wait_too_long_is_never_sent(make_limiter, clients, make_sandbox):
    # given a bucket blocked for 5 s
    api = make_sandbox(rate=100, burst=10, headers="none")
    limiter = make_limiter(LimiterConfig(rate=100.0, burst=1))
    limiter.block(5)
    client = clients(api.url, max_wait=0.3)
    # expect: WaitTooLong, and nothing reached the server
    with pytest.raises(WaitTooLong):
        client.get(f"{api.url}/never")
    assert api.stats()["arrivals"] == 0
