"""pytest plugin (`-p tests.before_settings` in pyproject.toml): what a test run sets up before
Django reads its settings.

- A Redis: REDIS_URL when one answers there; else a private redis-server, started here and
  stopped when the run ends, that REDIS_URL and every other variable naming a Redis (broker,
  cache, result backend) then point at.
- Under pytest-xdist, a Redis namespace per worker process (RATEJOBS_NAMESPACE): each worker
  has a test database of its own (pytest-django adds `_gw0`, `_gw1`), and the Celery workers
  its tests start must take only its own tasks from the broker, which names rows of it.

Both must happen before pytest-django loads the settings: the cache, the broker and the limiter
derive their addresses and key prefixes from the environment once, as the settings module is
read, and a conftest is loaded after that. The controller of an xdist run starts the Redis
before it starts its workers, which inherit REDIS_URL and find it answering.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Generator

import pytest

from devtools import devredis

redis_server_key = pytest.StashKey[devredis.RedisServer]()


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    # A wrapper's code before its yield runs before every plain implementation of the hook,
    # pytest-django's (which reads the settings) included.
    asked = early_config.known_args_namespace
    if not (getattr(asked, "help", False) or getattr(asked, "version", False)):
        server = devredis.ensure_for_environment(os.environ)
        early_config.stash[redis_server_key] = server
        early_config.add_cleanup(server.stop)
        _namespace_per_xdist_worker()
    return (yield)


def _namespace_per_xdist_worker() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    # The run's own namespace (the controller's, which the workers inherit), else one no other
    # run on this machine (another DATABASE_URL, another checkout) has; then the worker's.
    run = f"{os.environ.get('DATABASE_URL', '')}|{os.getcwd()}"
    base = os.environ.get("RATEJOBS_NAMESPACE") or hashlib.sha256(run.encode()).hexdigest()[:10]
    os.environ["RATEJOBS_NAMESPACE"] = f"{base}-{worker}"


def redis_server(config: pytest.Config) -> devredis.RedisServer:
    """The run's Redis, found or started by this plugin."""
    return config.stash[redis_server_key]
