"""The shared limiter as an aiohttp client middleware (aiohttp 3.12 and later):
`aiohttp.ClientSession(middlewares=(LimitedMiddleware(async_limiter),))`."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import ClientRequest, ClientResponse
from aiohttp.client_middlewares import ClientHandlerType

from ratejobs.limiter.adapters.accounting import MAX_COST_BODY_BYTES, Finish, Limited

# Leases being given back from a response's end-of-body callback: the event loop keeps only a
# weak reference to a task, and one collected midway would leave its place taken.
_GIVING_BACK: set[asyncio.Task] = set()


class LimitedMiddleware(Limited):
    """Every request of the session takes a slot of `limiter` first (WaitTooLong after max_wait
    seconds); its response is fed back to it, its real cost settled and its in-flight lease
    given back when the whole body has arrived or the response is released or closed. With
    `cost_json_field` the middleware reads the body itself before handing the response over
    (aiohttp keeps it, so `await response.json()` still works): use `cost_header` for a body
    you stream. With `retries`, a throttled request (429, or a 403 whose headers hint at a
    limit) is sent again after the block it caused. `cost`: each request's estimate, or a
    function of the aiohttp ClientRequest. `limiter` is an AsyncLimiter; the keyword arguments
    are Limited's."""

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        async def discard(response: ClientResponse) -> None:
            response.release()

        async def hand_over(response: ClientResponse, finish: Finish) -> None:
            if self.accounting.reads_body:
                body = await response.read()
                await finish.finish_async(body if len(body) <= MAX_COST_BODY_BYTES else None)
            else:
                _on_done(response, finish)

        return await self.send_limited_async(
            request,
            lambda fresh: handler(request),
            lambda response: (response.status, response.headers),
            discard,
            hand_over,
        )


def _on_done(response: ClientResponse, finish: Finish) -> None:
    """Give the lease back when the body has been read to its end, or the response is released
    or closed, whichever comes first (Finish acts once)."""
    loop = asyncio.get_running_loop()

    def done() -> None:
        task = loop.create_task(finish.finish_async())
        _GIVING_BACK.add(task)
        task.add_done_callback(_GIVING_BACK.discard)

    release, close = response.release, response.close

    def released() -> Any:
        try:
            return release()
        finally:
            done()

    def closed() -> None:
        try:
            close()
        finally:
            done()

    response.release = released  # type: ignore[method-assign]
    response.close = closed  # type: ignore[method-assign]
    response.content.on_eof(done)
