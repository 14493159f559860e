"""Concurrent GETs from one asyncio program with httpx, on the deployment's bucket.

python examples/asyncio_httpx.py API_NAME BASE_URL CALLS
"""

import asyncio
import os
import sys

import httpx
import redis.asyncio

from ratejobs.limiter import AsyncLimiter
from ratejobs.limiter.adapters import AsyncLimitedTransport


async def main(api: str, base_url: str, calls: int) -> None:
    limiter = AsyncLimiter(redis.asyncio.Redis.from_url(os.environ["REDIS_URL"]), api)
    at_once = asyncio.Semaphore(16)  # requests waiting for a slot or on the wire

    async def fetch(client: httpx.AsyncClient, i: int) -> int:
        async with at_once:
            return (await client.get(f"{base_url}/asyncio/{i}")).status_code

    async with httpx.AsyncClient(transport=AsyncLimitedTransport(limiter)) as client:
        statuses = await asyncio.gather(*(fetch(client, i) for i in range(calls)))
    print({status: statuses.count(status) for status in set(statuses)})


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
