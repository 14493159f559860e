"""A thread pool sending GETs with requests, on the deployment's bucket for one API.

    python examples/threads_requests.py API_NAME BASE_URL CALLS

Run with the deployment's environment (REDIS_URL, and DATABASE_URL or RATEJOBS_NAMESPACE): its
requests take their slots beside the workers' calls, and a 429 stops both.
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import redis
import requests

from ratejobs.limiter import Limiter
from ratejobs.limiter.adapters import LimitedAdapter

api, base_url, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
session = requests.Session()
session.mount(base_url, LimitedAdapter(Limiter(redis.Redis.from_url(os.environ["REDIS_URL"]), api)))


def fetch(i: int) -> int:
    return session.get(f"{base_url}/threads/{i}").status_code


with ThreadPoolExecutor(max_workers=16) as pool:
    statuses = list(pool.map(fetch, range(calls)))
print({status: statuses.count(status) for status in set(statuses)})
