"""Process bodies for the multi-process limiter tests (importable, so spawn can run them).

Each takes the limiter's config, as a worker does: a bucket left unused expires
(docs/limiter.md, T2), and a process started slowly on a loaded machine may be the one that
configures it again."""

from __future__ import annotations

import os
import time

import redis

from ratejobs.limiter import Limiter, LimiterConfig


def take_grants(
    redis_url: str,
    name: str,
    count: int,
    weight: int,
    barrier,
    results,
    hold: float = 0.0,
    config: LimiterConfig | None = None,
) -> None:
    """Take `count` grants one after another; report (slot_us, granted_us, weight, generation)."""
    limiter = Limiter(redis.Redis.from_url(redis_url), name, config)
    barrier.wait()
    grants = []
    for _ in range(count):
        grant = limiter.acquire(weight)
        if hold:
            time.sleep(hold)
        limiter.release(grant)
        grants.append((grant.slot_us, grant.granted_us, grant.weight, grant.generation))
    results.put((os.getpid(), grants, limiter.round_trips))


def take_grants_in_batches(
    redis_url: str,
    name: str,
    count: int,
    weight: int,
    barrier,
    results,
    hold: float = 0.0,
    batch: int = 8,
    config: LimiterConfig | None = None,
) -> None:
    """take_grants through acquire_many: batches of `batch`, each grant confirmed right before
    it counts as sent, the whole batch released in one call."""
    limiter = Limiter(redis.Redis.from_url(redis_url), name, config)
    barrier.wait()
    grants = []
    while len(grants) < count:
        reserved = limiter.acquire_many(min(batch, count - len(grants)), weight=weight)
        for grant in reserved:
            sent = limiter.confirm(grant)
            if hold:
                time.sleep(hold)
            grants.append((sent.slot_us, sent.granted_us, sent.weight, sent.generation))
        limiter.release_many(reserved)
    results.put((os.getpid(), grants, limiter.round_trips))


def take_grants_until(
    redis_url: str, name: str, seconds: float, barrier, results, config: LimiterConfig | None = None
) -> None:
    """Take grants for `seconds`; report (slot_us, granted_us) of each."""
    limiter = Limiter(redis.Redis.from_url(redis_url), name, config)
    barrier.wait()
    deadline = time.monotonic() + seconds
    grants = []
    while time.monotonic() < deadline:
        grant = limiter.acquire()
        limiter.release(grant)
        grants.append((grant.slot_us, grant.granted_us))
    results.put((os.getpid(), grants, limiter.round_trips))


def take_batches_until(
    redis_url: str,
    name: str,
    seconds: float,
    barrier,
    results,
    batch: int = 8,
    config: LimiterConfig | None = None,
) -> None:
    """take_grants_until through acquire_many, confirm and release_many."""
    limiter = Limiter(redis.Redis.from_url(redis_url), name, config)
    barrier.wait()
    deadline = time.monotonic() + seconds
    grants = []
    while time.monotonic() < deadline:
        reserved = limiter.acquire_many(batch)
        for grant in reserved:
            sent = limiter.confirm(grant)
            grants.append((sent.slot_us, sent.granted_us))
        limiter.release_many(reserved)
    results.put((os.getpid(), grants, limiter.round_trips))


def hold_lease_and_die(
    redis_url: str, name: str, lease_seconds: float, ready, config: LimiterConfig | None = None
) -> None:
    """Take a lease and die without releasing it, as a worker killed with -9 does."""
    limiter = Limiter(redis.Redis.from_url(redis_url), name, config)
    limiter.acquire(lease_seconds=lease_seconds)
    ready.set()
    time.sleep(3600)
