"""How much of an API's real limit the adaptive rate uses when the API enforces less than it
advertises: plain CUBIC, CUBIC that learns the real limit, and a plain token bucket
at the advertised rate, each over one job of N calls; prints one markdown table.

    python -m bench.adaptive [--calls N] [--rate R] [--real-rate R] [--burst B] [--threads T]

Each strategy gets a fresh sandbox enforcing --real-rate while advertising --rate (Retry-After
on 429, no quota headers) and a fresh limiter configured at --rate; T threads send the calls,
each 429 fed back to the limiter and sent again until all N have succeeded. Progress goes to
stderr, the table to stdout. Redis is REDIS_URL or redis://127.0.0.1:6379/0; when nothing
answers there, a private redis-server is started for the run (devtools.devredis).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from devtools import devredis
from ratejobs.limiter import Limiter, LimiterConfig
from sandbox import start_sandbox_process
from sandbox.drive import DriveResult, drive

# The case: a server that really allows 40 % of the configured rate. 100/s advertised
# and 40/s real keep a 600-call job to about 15-20 s per strategy.
DEFAULT_RATE = 100.0
DEFAULT_REAL_RATE = 40.0
DEFAULT_CALLS = 600
# The server's burst: small, as most APIs allow a handful at once.
DEFAULT_SERVER_BURST = 5
DEFAULT_THREADS = 4
KEY_PREFIX = "ratejobs-bench-adaptive"


@dataclass(frozen=True)
class Strategy:
    key: str
    label: str
    config: LimiterConfig


def strategies(rate: float) -> list[Strategy]:
    return [
        Strategy(
            "cubic",
            "adaptive, plain CUBIC (learn off)",
            LimiterConfig(rate=rate, adaptive=True, learn=False),
        ),
        Strategy(
            "learn",
            "adaptive, learning the real limit (the default)",
            LimiterConfig(rate=rate, adaptive=True),
        ),
        Strategy(
            "bucket",
            "token bucket at the advertised rate (not adaptive)",
            LimiterConfig(rate=rate),
        ),
    ]


@dataclass(frozen=True)
class Row:
    strategy: Strategy
    result: DriveResult
    learned: float | None
    decreases: int


def run(strategy: Strategy, args: argparse.Namespace, url: str, prefix: str) -> Row:
    server = start_sandbox_process(
        rate=args.rate, real_rate=args.real_rate, burst=args.burst, headers="none"
    )
    client = redis.Redis.from_url(url)
    name = f"{prefix}:{strategy.key}"
    try:
        Limiter(client, name, strategy.config).configure(strategy.config)
        result = drive(
            lambda: Limiter(client, name), server.url, calls=args.calls, threads=args.threads
        )
        state = Limiter(client, name).state()
        return Row(strategy, result, state.learned_rate, state.counts.decreases)
    finally:
        client.delete(*Limiter(client, name).keys)
        client.close()
        server.stop()


def render(rows: Sequence[Row], args: argparse.Namespace, load: float) -> str:
    real = args.real_rate
    half = args.calls // 2
    lines = [
        f"| strategy | seconds for {args.calls} calls | throughput / real limit | "
        f"second half / real limit | 429s | learned limit | rate cuts |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        result = row.result
        learned = "-" if row.learned is None else f"{row.learned:.1f}/s"
        lines.append(
            f"| {row.strategy.label} | {result.seconds:.1f} | {result.pace() / real:.1%} | "
            f"{result.pace(half) / real:.1%} | {result.throttled} "
            f"({result.throttled_share:.1%}) | {learned} | {row.decreases} |"
        )
    lines += [
        "",
        f"The sandbox advertises {args.rate:g}/s and enforces {real:g}/s with a burst of "
        f"{args.burst} (Retry-After on 429, no quota headers); the limiter is configured at "
        f"{args.rate:g}/s, burst 1; {args.threads} threads in one process each take a grant, "
        f"send, feed the response back (observe) and send a 429'd call again. "
        f"{os.cpu_count()} cores, load average {load:.2f} at the start.",
        "",
        "- *throughput*: calls that succeeded per second, from the start to the last success.",
        f"- *second half*: the same over calls {half + 1}-{args.calls}, once the initial "
        "discovery (a few throttles, each blocking every thread for Retry-After) is over.",
        "- *429s*: answers 429 among all answers (the sandbox counted the same).",
    ]
    return "\n".join(lines)


def _progress(message: str) -> None:
    print(f"[bench.adaptive] {message}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.adaptive", description=__doc__)
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS)
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="advertised, per second")
    parser.add_argument(
        "--real-rate", type=float, default=DEFAULT_REAL_RATE, help="enforced, per second"
    )
    parser.add_argument("--burst", type=int, default=DEFAULT_SERVER_BURST, help="the server's")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--only", default="", help="comma-separated strategies: cubic,learn,bucket")
    args = parser.parse_args(argv)
    if min(args.calls, args.rate, args.real_rate, args.burst, args.threads) <= 0:
        parser.error("--calls, --rate, --real-rate, --burst and --threads must be positive")
    if args.real_rate > args.rate:
        parser.error("--real-rate must be at most --rate")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    chosen = [s for s in strategies(args.rate) if not only or s.key in only]
    load = os.getloadavg()[0]
    server = devredis.ensure(os.environ.get("REDIS_URL", devredis.DEFAULT_URL))
    if server.started_here:
        _progress(f"no Redis answered; started a private one at {server.url}")
    prefix = f"{KEY_PREFIX}:{os.getpid()}-{time.time_ns()}"
    rows = []
    try:
        for strategy in chosen:
            _progress(f"{strategy.key}: {args.calls} calls, {args.rate:g}/s advertised, "
                      f"{args.real_rate:g}/s real")  # fmt: skip
            rows.append(run(strategy, args, server.url, prefix))
    finally:
        server.stop()
    print(render(rows, args, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
