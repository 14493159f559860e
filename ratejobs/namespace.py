"""The deployment's namespace in Redis: every key ratejobs writes there (limiters, dispatch
requests, locks, the cache, the broker's queues) starts with `ratejobs:<namespace>:`, so two
deployments on one Redis never share state by accident. Limiters alone may be shared on
purpose (RATEJOBS_LIMITER_NAMESPACE): the rest names rows of one database. How the namespace is
found (the settings, and programs outside Django) is in ratejobs.limiter.deployment."""

from __future__ import annotations

from ratejobs.limiter import deployment


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
    return deployment.limiter_key_prefix(limiter_namespace())


def broker_key(name: str) -> str:
    """The Redis key of the broker's list (a queue) or other key named `name`, as kombu's Redis
    transport stores it under the broker's global_keyprefix (the deployment's namespace)."""
    from django.conf import settings

    return settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "") + name
