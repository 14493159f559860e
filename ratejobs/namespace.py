"""The deployment's namespace in Redis: every key ratejobs writes there (limiters, dispatch
requests, locks, the cache, the broker's queues) starts with `ratejobs:<namespace>:`, so two
deployments on one Redis never share state by accident. Limiters alone may be shared on
purpose (RATEJOBS_LIMITER_NAMESPACE): the rest names rows of one database."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A namespace sits inside key names and SCAN patterns (ratejobs.limiter.buckets): no ':' (the
# separator), no glob characters and no braces (Redis Cluster's hash tags).
_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# Hex digits of the database's hash: 2^40 names, so two databases meet by chance practically
# never, and a key stays short to read in redis-cli.
DERIVED_LENGTH = 10


def check_namespace(namespace: str) -> str:
    """`namespace` when it may name keys; ValueError saying what is allowed otherwise."""
    if not _NAMESPACE.match(namespace):
        raise ValueError(
            f"RATEJOBS_NAMESPACE {namespace!r}: 1-64 of A-Z a-z 0-9 _ . - (no ':', '*' or braces)"
        )
    return namespace


def namespace_for_database(database: Mapping[str, Any]) -> str:
    """A short stable name for the deployment whose truth is `database` (a DATABASES entry):
    a hash of its engine, host, port and name, or of a SQLite file's absolute path. Processes
    of one deployment (web, workers, beat) open the same database, so they agree on it."""
    engine = str(database.get("ENGINE", ""))
    name = str(database.get("NAME", ""))
    if engine.endswith("sqlite3"):
        identity = f"sqlite|{Path(name).expanduser().resolve()}"
    else:
        host = database.get("HOST") or "localhost"
        identity = f"{engine}|{host}|{database.get('PORT') or ''}|{name}"
    return hashlib.sha256(identity.encode()).hexdigest()[:DERIVED_LENGTH]


def redis_key(*parts: object) -> str:
    """`ratejobs:<namespace>:<part>:<part>...`: a Redis key of this deployment."""
    from django.conf import settings

    return ":".join(["ratejobs", settings.RATEJOBS_NAMESPACE, *map(str, parts)])


def limiter_namespace() -> str:
    """The namespace of this deployment's limiters: RATEJOBS_LIMITER_NAMESPACE when set (shared
    with another deployment on purpose), else the deployment's own."""
    from django.conf import settings

    return settings.RATEJOBS_LIMITER_NAMESPACE or settings.RATEJOBS_NAMESPACE


def limiter_key_prefix() -> str:
    """What this deployment's limiters' keys start with (Limiter's key_prefix)."""
    return f"ratejobs:{limiter_namespace()}:limiter"


def broker_key(name: str) -> str:
    """The Redis key of the broker's list (a queue) or other key named `name`, as kombu's Redis
    transport stores it under the broker's global_keyprefix (the deployment's namespace)."""
    from django.conf import settings

    return settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "") + name
