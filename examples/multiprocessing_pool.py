"""A multiprocessing pool: each process has its own Redis client and limiter on the same
deployment's bucket, so the pool as a whole keeps the API's pace.

    python examples/multiprocessing_pool.py API_NAME BASE_URL CALLS
"""

import os
import sys
from multiprocessing import Pool

import redis
import requests

from ratejobs.limiter import Limiter
from ratejobs.limiter.adapters import LimitedAdapter

session: requests.Session


def start(api: str, base_url: str) -> None:
    """Each process makes its own connections: sockets do not survive a fork."""
    global session
    session = requests.Session()
    limiter = Limiter(redis.Redis.from_url(os.environ["REDIS_URL"]), api)
    session.mount(base_url, LimitedAdapter(limiter))


def fetch(url: str) -> int:
    return session.get(url).status_code


if __name__ == "__main__":
    api, base_url, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Pool(4, initializer=start, initargs=(api, base_url)) as pool:
        statuses = pool.map(fetch, [f"{base_url}/processes/{i}" for i in range(calls)])
    print({status: statuses.count(status) for status in set(statuses)})
