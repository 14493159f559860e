"""The shared limiter as an httpx transport: `httpx.Client(transport=LimitedTransport(limiter))`,
`httpx.AsyncClient(transport=AsyncLimitedTransport(async_limiter))`. Each wraps httpx's default
transport for the client's kind (or the one given), so pools, HTTP/2 and proxies stay as set."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx

from ratejobs.limiter.adapters.accounting import MAX_COST_BODY_BYTES, Finish, Limited
from ratejobs.limiter.aio import AsyncLimiter
from ratejobs.limiter.sync import Limiter

# httpcore's trace events (httpx's "trace" extension) as a request's headers are about to be
# written, on HTTP/1.1 and HTTP/2, once its connection is open: the last moment to see that its
# grant went stale meanwhile (a new connection's DNS, TCP and TLS, or httpcore's first use in
# the process, come after the grant). Another transport never calls the trace: the check made
# before handing it the request stands.
WRITE_STARTS = ("http11.send_request_headers.started", "http2.send_request_headers.started")


class LimitedTransport(Limited, httpx.BaseTransport):
    """Every request takes a slot of `limiter` first (WaitTooLong after max_wait seconds); its
    response is fed back to it, its real cost settled (`cost_header`, or `cost_json_field` in
    the body once read) and its in-flight lease given back when the body has been read or the
    response closed. With `retries`, a throttled request (429, or a 403 whose headers hint at a
    limit) is sent again after the block it caused. `cost`: each request's estimate, or a
    function of the httpx.Request. `transport`: the one to send through (httpx's default);
    the other keyword arguments are Limited's."""

    def __init__(
        self, limiter: Limiter, *, transport: httpx.BaseTransport | None = None, **options: Any
    ) -> None:
        super().__init__(limiter, **options)
        self.transport = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        def hand_over(response: httpx.Response, finish: Finish) -> None:
            response.stream = _FinishingStream(response, finish)

        traced = request.extensions.get("trace")

        def send(fresh: Callable[[], None]) -> httpx.Response:
            def trace(event: str, info: dict[str, Any]) -> None:
                if event.endswith(WRITE_STARTS):
                    fresh()
                if traced is not None:
                    traced(event, info)

            extensions = request.extensions
            request.extensions = {**extensions, "trace": trace}
            try:
                return self.transport.handle_request(request)
            finally:  # the caller's request as it was, to send again without a stale hook
                request.extensions = extensions

        return self.send_limited(
            request,
            send,
            _answer,
            httpx.Response.close,
            hand_over,
        )

    def close(self) -> None:
        self.transport.close()


class AsyncLimitedTransport(Limited, httpx.AsyncBaseTransport):
    """LimitedTransport for httpx.AsyncClient, with an AsyncLimiter."""

    def __init__(
        self,
        limiter: AsyncLimiter,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(limiter, **options)
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        async def hand_over(response: httpx.Response, finish: Finish) -> None:
            response.stream = _AsyncFinishingStream(response, finish)

        traced = request.extensions.get("trace")

        async def send(fresh: Callable[[], Awaitable[None]]) -> httpx.Response:
            async def trace(event: str, info: dict[str, Any]) -> None:
                if event.endswith(WRITE_STARTS):
                    await fresh()
                if traced is not None:
                    await traced(event, info)

            extensions = request.extensions
            request.extensions = {**extensions, "trace": trace}
            try:
                return await self.transport.handle_async_request(request)
            finally:  # the caller's request as it was, to send again without a stale hook
                request.extensions = extensions

        return await self.send_limited_async(
            request,
            send,
            _answer,
            httpx.Response.aclose,
            hand_over,
        )

    async def aclose(self) -> None:
        await self.transport.aclose()


def _answer(response: httpx.Response) -> tuple[int, Any]:
    return response.status_code, response.headers


class _Body:
    """The raw bytes of a response kept for its JSON cost (when the adapter reads one), decoded
    from gzip or deflate; None past MAX_COST_BODY_BYTES or when it cannot be read."""

    def __init__(self, response: httpx.Response, wanted: bool) -> None:
        self.kept: bytearray | None = bytearray() if wanted else None
        encoding = response.headers.get("content-encoding", "").strip().lower()
        self.encoding = encoding if encoding in ("", "identity", "gzip", "deflate") else None

    def add(self, chunk: bytes) -> None:
        if self.kept is not None:
            self.kept += chunk
            if len(self.kept) > MAX_COST_BODY_BYTES:
                self.kept = None

    def whole(self) -> bytes | None:
        if self.kept is None or self.encoding is None:
            return None
        if self.encoding in ("", "identity"):
            return bytes(self.kept)
        # gzip or zlib, told apart by their headers (47), else raw deflate, as servers send too
        for wbits in (47, -15):
            try:
                return zlib.decompressobj(wbits=wbits).decompress(
                    bytes(self.kept), MAX_COST_BODY_BYTES
                )
            except zlib.error:
                continue
        return None


class _FinishingStream(httpx.SyncByteStream):
    def __init__(self, response: httpx.Response, finish: Finish) -> None:
        self._inner: Any = response.stream
        self._finish = finish
        self._body = _Body(response, finish.accounting.reads_body)

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._body.add(chunk)
            yield chunk
        self._finish(self._body.whole())

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._finish()


class _AsyncFinishingStream(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, finish: Finish) -> None:
        self._inner: Any = response.stream
        self._finish = finish
        self._body = _Body(response, finish.accounting.reads_body)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._body.add(chunk)
            yield chunk
        await self._finish.finish_async(self._body.whole())

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await self._finish.finish_async()
