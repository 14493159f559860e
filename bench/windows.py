"""What several windows per limiter cost a grant: acquire + release, one after another, with
the main rate only, then with 1, 3 and 8 windows (the most a limiter takes), one of them a cost
window; prints one markdown table.

    python -m bench.windows [--grants N]

Each row reports grants per second from one process (round trips included) and the Redis time
of the acquire script per call (INFO commandstats, reset before each row). The limits are far
above what is asked, so no grant waits: this measures the scripts, not a pace. Redis: REDIS_URL
(default redis://127.0.0.1:6379/0); the bench's keys are removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Sequence

import redis

from ratejobs.limiter import Limiter, LimiterConfig, Window

DEFAULT_GRANTS = 5000
HUGE = 1_000_000


def windows(count: int) -> tuple[Window, ...]:
    """`count` windows that never bind: hourly, daily... and one cost window."""
    made = [Window(HUGE, 60.0 * (i + 1), HUGE) for i in range(count - 1)]
    return (*made, Window(HUGE, 60.0, HUGE, "cost")) if count else ()


def measure(client: redis.Redis, count: int, grants: int) -> tuple[float, float]:
    """Grants per second and µs of Redis time per acquire with `count` windows."""
    name = f"bench-windows-{uuid.uuid4().hex[:8]}"
    limiter = Limiter(client, name, LimiterConfig(rate=HUGE, burst=HUGE, windows=windows(count)))
    limiter.configure(limiter.config)
    try:
        client.config_resetstat()
        started = time.perf_counter()
        for _ in range(grants):
            limiter.release(limiter.acquire(cost=1))
        elapsed = time.perf_counter() - started
        stats = client.info("commandstats")
        # acquire and release both run as functions (FCALL), or as EVALSHA on a Redis before
        # 7.0: reported together, per grant
        usec = sum(stats.get(f"cmdstat_{name}", {}).get("usec", 0) for name in ("fcall", "evalsha"))
        per_pair = usec / grants
        return grants / elapsed, per_pair
    finally:
        client.delete(*limiter.keys)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.windows", description=__doc__)
    parser.add_argument("--grants", type=int, default=DEFAULT_GRANTS)
    args = parser.parse_args(argv)
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    rows = []
    for count in (0, 1, 3, 8):
        print(f"{count} windows...", file=sys.stderr)
        rows.append((count, *measure(client, count, args.grants)))
    base = rows[0][2]
    print(
        "| windows besides the rate | grants/s (one process) "
        "| Redis µs per grant (acquire + release) | vs none |"
    )
    print("|--:|--:|--:|--:|")
    for count, rate, usec in rows:
        print(f"| {count} | {rate:,.0f} | {usec:.1f} | {usec / base - 1:+.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
