"""A small crawler with aiohttp: a queue of pages, a few workers taking from it, every request
on the deployment's bucket.

    python examples/aiohttp_crawler.py API_NAME BASE_URL PAGES
"""

import asyncio
import os
import sys
from collections import Counter

import aiohttp
import redis.asyncio

from ratejobs.limiter import AsyncLimiter
from ratejobs.limiter.adapters import LimitedMiddleware


async def crawl(session: aiohttp.ClientSession, pages: asyncio.Queue, seen: Counter) -> None:
    while True:
        url = await pages.get()
        async with session.get(url) as response:
            await response.read()
            seen[response.status] += 1
        pages.task_done()


async def main(api: str, base_url: str, count: int) -> None:
    limiter = AsyncLimiter(redis.asyncio.Redis.from_url(os.environ["REDIS_URL"]), api)
    pages: asyncio.Queue = asyncio.Queue()
    for i in range(count):
        pages.put_nowait(f"{base_url}/crawl/{i}")
    seen: Counter = Counter()
    async with aiohttp.ClientSession(middlewares=(LimitedMiddleware(limiter),)) as session:
        workers = [asyncio.create_task(crawl(session, pages, seen)) for _ in range(8)]
        await pages.join()
        for worker in workers:
            worker.cancel()
    print(dict(seen))


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
