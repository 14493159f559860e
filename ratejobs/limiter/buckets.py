"""The family of limiters named `{base}:{key}` (one bucket per credential key of an API): how many
have live state in Redis, which are throttled or blocked most, and resetting them all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ratejobs.limiter.core import LIVE_KEY_PARTS, translate_redis_errors
from ratejobs.limiter.deployment import deployment_key_prefix

# Keys looked at by one overview: SCAN walks the whole keyspace, so a listing stays a bounded
# amount of work however many customers an API has (beyond it the count says "at least").
DEFAULT_SCAN_LIMIT = 10_000
# Keys SCAN is asked for per step: large enough that a big keyspace takes few round trips.
SCAN_COUNT = 1_000
MICROS = 1_000_000


@dataclass(frozen=True)
class KeyBucket:
    key: str  # the credential key: the part of the limiter's name after `{base}:`
    throttles: int  # throttles (429s) it received since its state was created or reset
    blocked_for: float  # seconds until its block ends; 0: not blocked


@dataclass(frozen=True)
class KeyBuckets:
    live: int  # keys with live state found (at least this many when `complete` is false)
    complete: bool  # false: the scan stopped at its limit
    top: list[KeyBucket]  # the most blocked, then most throttled, first


def _pattern(base: str, key_prefix: str) -> str:
    # A base name (an API's) never holds ':' nor a glob character, nor does a key prefix made
    # of namespaces (ratejobs.namespace), so this matches exactly the limiters `{base}:{key}`
    # and none of another base.
    return f"{key_prefix}:{{{base}:*}}:state"


def _key_of(redis_key: bytes | str, base: str, key_prefix: str) -> str:
    text = redis_key.decode() if isinstance(redis_key, bytes) else redis_key
    prefix = f"{key_prefix}:{{{base}:"
    return text[len(prefix) : -len("}:state")]


def _scan(client: Any, base: str, limit: int, key_prefix: str) -> tuple[list[str], bool]:
    found: list[str] = []
    for redis_key in client.scan_iter(match=_pattern(base, key_prefix), count=SCAN_COUNT):
        if len(found) >= limit:
            return found, False
        found.append(_key_of(redis_key, base, key_prefix))
    return found, True


def key_buckets(
    client: Any,
    base: str,
    *,
    top: int = 10,
    limit: int = DEFAULT_SCAN_LIMIT,
    key_prefix: str | None = None,
) -> KeyBuckets:
    """The live buckets of `base`'s keys (at most `limit` looked at) and the `top` most blocked
    or throttled, among limiters under `key_prefix` (Limiter's, the deployment's by default);
    LimiterUnavailable when Redis cannot be reached."""
    key_prefix = key_prefix or deployment_key_prefix()
    with translate_redis_errors(base):
        keys, complete = _scan(client, base, limit, key_prefix)
        if top <= 0:  # a count only (the metric): no state read
            return KeyBuckets(live=len(keys), complete=complete, top=[])
        pipe = client.pipeline(transaction=False)
        pipe.time()
        for key in keys:
            pipe.hmget(f"{key_prefix}:{{{base}:{key}}}:state", "blocked_until", "n_throttles")
        replies = pipe.execute() if keys else [client.time()]
    seconds, micros = replies[0]
    now_us = int(seconds) * MICROS + int(micros)
    buckets = []
    for key, (blocked_until, throttles) in zip(keys, replies[1:], strict=True):
        blocked_for = max(0, int(blocked_until or 0) - now_us) / MICROS
        buckets.append(KeyBucket(key, int(throttles or 0), blocked_for))
    buckets.sort(key=lambda b: (-b.blocked_for, -b.throttles, b.key))
    ranked = [b for b in buckets if b.blocked_for or b.throttles][:top]
    return KeyBuckets(live=len(keys), complete=complete, top=ranked)


def reset_key_buckets(client: Any, base: str, *, key_prefix: str | None = None) -> int:
    """Forget the live state of every `{base}:{key}` limiter under `key_prefix` (their
    configurations stay, as a reset of one limiter keeps its own); returns how many were
    reset."""
    key_prefix = key_prefix or deployment_key_prefix()
    reset = 0
    with translate_redis_errors(base):
        batch: list[str] = []
        for redis_key in client.scan_iter(match=_pattern(base, key_prefix), count=SCAN_COUNT):
            batch.append(_key_of(redis_key, base, key_prefix))
            if len(batch) >= SCAN_COUNT:
                reset += _delete_state(client, base, batch, key_prefix)
                batch = []
        reset += _delete_state(client, base, batch, key_prefix)
    return reset


def _delete_state(client: Any, base: str, keys: list[str], key_prefix: str) -> int:
    if not keys:
        return 0
    pipe = client.pipeline(transaction=False)
    for key in keys:
        stem = f"{key_prefix}:{{{base}:{key}}}"
        # one DEL per limiter: each lives in its own hash slot on a Redis Cluster; the keys a
        # reset forgets (LIVE_KEY_PARTS, as Limiter.reset does)
        pipe.delete(*(f"{stem}:{part}" for part in LIVE_KEY_PARTS))
    pipe.execute()
    return len(keys)
