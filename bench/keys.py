"""Redis memory per credential key's bucket, while in use and after its idle expiry; and grants
per second through `Limiter.acquire` for one credential key against thousands taken
round-robin, on a real Redis: a key's bucket must cost no more per grant than the API's one.

    python -m bench.keys [--memory-keys 10000] [--keys 5000] [--seconds 5] [--processes 2]
                         [--rounds 3] [--memory-only]

Memory: a private redis-server (so nothing else moves its used_memory) holds `--memory-keys`
buckets named `{api}:{key}` as the workers make them (no rate history), each with the main
rate and two windows, one of them a cost window (whose refund history a settle reads); each
key sends two calls (acquire with a cost estimate, settle with the real cost, release). It
reports used_memory over the empty server per key and in total, then waits for the buckets'
expiry (short windows and leases, so it comes in seconds; longer ones only make it later) and
reports what is left.

Throughput: each process holds one Limiter per key (as a worker's cache does), named
`{api}:{key}` with the same limits, high enough (1,000,000/s per key) that nobody waits: the
figure is the limiter's own cost. Every bucket is configured and warmed up before the clock
starts (its first grant writes its configuration: a cost paid once per key and process). Each
grant is `acquire()` followed by `release()`, as bench.limiter's "ours" row. Runs alternate (1
key, N keys, 1 key, ...) so that load from elsewhere on the machine falls on both; the table
gives each run and the median. Redis: REDIS_URL (default redis://127.0.0.1:6379/0); its keys
are removed afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence

import redis

from devtools import devredis
from ratejobs.limiter import Limiter, LimiterConfig, Window

# Per key: far above what a few processes can ask, so every acquire is granted at once.
RATE = 1_000_000.0
BURST = 1_000
# The memory run's limits: a rate and two windows (one counting cost) of a minute, longer than
# writing 10,000 buckets takes, so all are in use when measured and the idle expiry comes a
# minute later; a bucket's state does not depend on the periods. Leases are short.
MEMORY_CONFIG = LimiterConfig(
    rate=100.0, burst=10, windows=(Window(500.0, 60.0, 50), Window(90000.0, 60.0, 9000, "cost"))
)
MEMORY_LEASE_SECONDS = 1.0
CALLS_PER_KEY = 2
ESTIMATE, USED = 100, 40
EXPIRY_TIMEOUT_SECONDS = 120.0


def measure_memory(keys: int) -> dict[str, float]:
    """used_memory of a private Redis with `keys` buckets in use, and after their expiry."""
    server = devredis.start_private_redis()
    try:
        client = redis.Redis.from_url(server.url)
        # the scripts' cache is paid once per Redis, not per bucket: loaded before the baseline
        warm = Limiter(client, "bench:warm-up", MEMORY_CONFIG, rate_samples_kept=0)
        warm.release(warm.acquire(cost=ESTIMATE))
        warm.state()
        client.flushdb()
        empty = client.info("memory")["used_memory"]
        for i in range(keys):
            limiter = Limiter(client, f"bench:k{i}", MEMORY_CONFIG, rate_samples_kept=0)
            for _ in range(CALLS_PER_KEY):
                grant = limiter.acquire(cost=ESTIMATE, lease_seconds=MEMORY_LEASE_SECONDS)
                limiter.settle(grant, USED)
                limiter.release(grant)
        used = client.info("memory")["used_memory"] - empty
        redis_keys = client.dbsize()
        sample = list(client.scan_iter(match="*{bench:k0}*"))
        usage = sum(client.memory_usage(key, samples=0) for key in sample)
        persistent = sum(1 for key in client.scan_iter(count=1000) if client.pttl(key) == -1)
        started = time.monotonic()  # about when the last bucket was used
        while client.dbsize() and time.monotonic() - started < EXPIRY_TIMEOUT_SECONDS:
            time.sleep(0.2)
        return {
            "keys": keys,
            "redis_keys": redis_keys,
            "without_expiry": persistent,
            "used": used,
            "memory_usage_one": usage,
            "expired_after": time.monotonic() - started,
            "left_keys": client.dbsize(),
            "left_used": client.info("memory")["used_memory"] - empty,
        }
    finally:
        server.stop()


def print_memory(m: dict[str, float]) -> None:
    keys = int(m["keys"])
    print(f"| buckets (2 windows, {CALLS_PER_KEY} calls each) | Redis keys | without expiry | "
          "used_memory | per bucket | MEMORY USAGE of one bucket's keys |")  # fmt: skip
    print("|--:|--:|--:|--:|--:|--:|")
    print(f"| {keys:,} in use | {int(m['redis_keys']):,} | {int(m['without_expiry']):,} | "
          f"{m['used'] / 2**20:,.2f} MiB | {m['used'] / keys:,.0f} B | "
          f"{int(m['memory_usage_one']):,} B |")  # fmt: skip
    print(
        f"| {keys:,} after {m['expired_after']:.1f} s idle | {int(m['left_keys']):,} | | "
        f"{max(0, m['left_used']) / 2**20:,.2f} MiB | {max(0, m['left_used']) / keys:,.0f} B | |"
    )
    print()


def _run(url: str, names: list[str], seconds: float, start_at: float, out: multiprocessing.Queue):
    client = redis.Redis.from_url(url)
    config = LimiterConfig(rate=RATE, period=1.0, burst=BURST)
    limiters = [Limiter(client, name, config) for name in names]
    for limiter in limiters:  # configure and load the scripts before the clock starts
        limiter.release(limiter.acquire(max_wait=1))
    time.sleep(max(0.0, start_at - time.time()))
    grants, i, count = 0, 0, len(limiters)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        limiter = limiters[i]
        limiter.release(limiter.acquire(max_wait=1))
        grants += 1
        i = i + 1 if i + 1 < count else 0
    out.put(grants)


def measure(url: str, base: str, keys: int, processes: int, seconds: float) -> float:
    """Grants per second of `processes` processes, each going round-robin over the same
    `keys` buckets (offset, so they do not move in step)."""
    names = [f"{base}:k{i}" for i in range(keys)]
    out: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
    ctx = multiprocessing.get_context("spawn")
    # warm-up (configuring 5,000 buckets) takes a few seconds: start together after it
    start_at = time.time() + 3 + keys / 1000
    workers = [
        ctx.Process(target=_run, args=(url, names[p:] + names[:p], seconds, start_at, out))
        for p in range(processes)
    ]
    for worker in workers:
        worker.start()
    total = sum(out.get() for _ in workers)
    for worker in workers:
        worker.join()
    return total / seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keys", description=__doc__)
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-keys", type=int, default=10_000)
    parser.add_argument("--memory-only", action="store_true")
    args = parser.parse_args(argv)
    print_memory(measure_memory(args.memory_keys))
    if args.memory_only:
        return 0
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    base = f"bench-keys-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    results: dict[int, list[float]] = {1: [], args.keys: []}
    try:
        for _ in range(args.rounds):
            for keys in results:
                results[keys].append(measure(url, base, keys, args.processes, args.seconds))
    finally:
        stale = list(client.scan_iter(match=f"ratejobs:limiter:{{{base}:*", count=1000))
        for start in range(0, len(stale), 1000):
            client.delete(*stale[start : start + 1000])
    print(f"| keys (round-robin) | grants/s, each run ({args.processes} processes, "
          f"{args.seconds:g} s) | median |")  # fmt: skip
    print("|--:|--|--:|")
    for keys, runs in results.items():
        each = ", ".join(f"{r:,.0f}" for r in runs)
        print(f"| {keys:,} | {each} | {statistics.median(runs):,.0f} |")
    one, many = (statistics.median(runs) for runs in results.values())
    print(f"\n{args.keys:,} keys / 1 key: {many / one:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
