"""pytest plugin (`-p tests.private_redis` in pyproject.toml): a Redis for the test run before
Django reads its settings.

REDIS_URL when one answers there; else a private redis-server, started here and stopped when
the run ends, that REDIS_URL and every other variable naming a Redis (broker, cache, result
backend) then point at. It must run before pytest-django loads the settings: the cache, the
broker and the limiter derive their addresses from the environment once, as the settings
module is read, and a conftest is loaded after that.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from ratejobs import devredis

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
    return (yield)


def redis_server(config: pytest.Config) -> devredis.RedisServer:
    """The run's Redis, found or started by this plugin."""
    return config.stash[redis_server_key]
