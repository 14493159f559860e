"""Fixtures shared by every test: a Redis that answers, a client for it, a unique name per test.

The Redis is found or started before Django reads its settings (tests/before_settings.py). The
database needs nothing here: settings read DATABASE_URL (PostgreSQL in CI) and fall back to
SQLite. Tests marked `postgresql` (races between transactions, the database's clock) mean
nothing on SQLite, which has one writer, and skip there; with CI=true a skip is a failure
(tests/every_test_runs.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from devtools import devredis
from ratejobs.infra import connections, limiters
from ratejobs.limiter import Limiter, LimiterConfig
from ratejobs.models import Api, Job
from ratejobs.namespace import limiter_key_prefix, redis_key
from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create
from tests.before_settings import redis_server
from tests.realhttp import http_server, marker  # noqa: F401 (fixtures)
from tests.realparts import (  # noqa: F401 (fixtures)
    module_worker,
    sandbox,
    shared_worker,
    start_beat,
    start_worker,
)

# Processes the tests start (workers, gunicorn, manage.py) open the test database, whose name
# is not the one this process derived its Redis namespace from: they inherit this one, or they
# would use other limiters and another broker queue than the tests.
os.environ["RATEJOBS_NAMESPACE"] = settings.RATEJOBS_NAMESPACE


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "postgresql: a race or clock test that means something only on PostgreSQL"
    )
    config.addinivalue_line(
        "markers",
        "paced: measures a pace against the wall clock; make test runs these in a pass of their "
        "own, with no other test process beside them",
    )
    config.addinivalue_line(
        "markers",
        "e2e: starts real Celery workers or beat (given to every test using a fixture of "
        "WORKER_FIXTURES); make test-fast leaves these out",
    )
    config.addinivalue_line(
        "markers",
        "slow: takes seconds of its own (a property search, pytest or a server run as a "
        "subprocess, a body of many MiB, a wait on the real clock); make test-fast leaves these "
        "out",
    )
    _flush_again_after_a_deadlock()


# The fixtures of tests/realparts.py that start a real `celery -A project worker` (or beat).
WORKER_FIXTURES = frozenset({"start_worker", "module_worker", "shared_worker", "start_beat"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts real Celery processes is marked e2e, so the inner loop
    (make test-fast) can leave out the slowest tests without each one saying so."""
    for item in items:
        if WORKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


# A transactional test ends with one TRUNCATE of every table, while a module's shared worker
# goes on writing heartbeats and sweeping; a statement of the worker that locks two tables in
# the other order deadlocks with it, and PostgreSQL may pick the TRUNCATE as the victim. The
# flush is one transaction (rolled back whole), so it is run again; three deadlocks in a row
# are a real problem and fail the test.
FLUSH_ATTEMPTS = 3


def _flush_again_after_a_deadlock() -> None:
    from django.db.utils import OperationalError
    from django.test import TransactionTestCase

    flush = TransactionTestCase._fixture_teardown
    if getattr(flush, "retries_deadlocks", False):
        return

    def flush_retrying(self: TransactionTestCase) -> None:
        for attempt in range(1, FLUSH_ATTEMPTS + 1):
            try:
                return flush(self)
            except Exception as exc:  # flush's CommandError, caused by the database's error
                cause = exc.__cause__ or exc
                deadlock = isinstance(cause, OperationalError) and "deadlock" in str(cause)
                if not deadlock or attempt == FLUSH_ATTEMPTS:
                    raise

    flush_retrying.retries_deadlocks = True  # type: ignore[attr-defined]
    TransactionTestCase._fixture_teardown = flush_retrying  # type: ignore[method-assign]


def pytest_runtest_setup(item: pytest.Item) -> None:
    from django.db import connection

    if item.get_closest_marker("postgresql") and connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: SQLite has one writer and no clock of its own")


@pytest.fixture(scope="session")
def redis_url(pytestconfig: pytest.Config) -> str:
    """The run's Redis: REDIS_URL if one answered there, else a private redis-server that the
    settings and every subprocess already follow (tests/before_settings.py)."""
    return redis_server(pytestconfig).url


@pytest.fixture(scope="session", autouse=True)
def no_sweep_lock_left_by_an_earlier_run(redis_url: str) -> None:
    """A test's engine that took the deployment's sweep lock for long would stop every later
    run on this database and Redis from taking back a killed worker's calls (the namespace
    derives from DATABASE_URL): the run starts with none."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(redis_key("sweep", "lock"))
    finally:
        client.close()


@pytest.fixture
def throttles_in_the_test_redis(redis_url: str, unique_name: str, settings: Any) -> None:
    """The shared cache (the REST API's job-creation throttle) is the test Redis, under a prefix
    of this test's own, so no test sees another's counts. Used by every test of tests/rest and
    tests/security, which create jobs through the REST API."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": f"ratejobs:test-cache:{unique_name}",
        }
    }


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=False)
    yield client
    client.close()


@pytest.fixture
def unique_name() -> str:
    """A key prefix / limiter name no other test uses, so tests sharing one Redis don't collide."""
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def make_limiter(redis_client, unique_name) -> Iterator[Callable[..., Limiter]]:
    """Limiters under this test's unique name, configured when given a config; their keys
    are deleted afterwards."""
    made: list[Limiter] = []

    def make(config: LimiterConfig | None = None, name: str = unique_name) -> Limiter:
        limiter = Limiter(redis_client, name, config)
        if config is not None:
            limiter.configure(config)
        made.append(limiter)
        return limiter

    yield make
    for limiter in made:
        redis_client.delete(*limiter.keys)


def _forget_redis_clients() -> None:
    """Drop the process's cached Redis client and limiters so the next use reads REDIS_URL."""
    if connections.redis_client.cache_info().currsize:
        connections.redis_client().connection_pool.disconnect()
    connections.redis_client.cache_clear()
    limiters._limiters.clear()


@pytest.fixture
def services_redis(redis_url: str, redis_client: Any, unique_name: str, db: None) -> Iterator[None]:
    """The services talk to the test Redis; the limiter keys of the test's APIs (all named
    after `unique_name`) are removed afterwards."""
    _forget_redis_clients()
    yield
    keys = list(redis_client.scan_iter(match=f"{limiter_key_prefix()}:{{{unique_name}*"))
    if keys:
        redis_client.delete(*keys)
    _forget_redis_clients()


@pytest.fixture
def redis_down() -> Iterator[None]:
    """The services' Redis is a port nobody listens on (the limiter fails closed there)."""
    real = settings.REDIS_URL
    settings.REDIS_URL = f"redis://127.0.0.1:{devredis.free_port()}/0"
    _forget_redis_clients()
    yield
    settings.REDIS_URL = real
    _forget_redis_clients()


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="alice-password")


@pytest.fixture
def other_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("mallory", password="mallory-password")


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("sam", password="sam-password", is_staff=True)


@pytest.fixture
def manager(django_user_model: Any) -> Any:
    """Staff who manage APIs through the ratejobs.manage_api permission, given by a group."""
    from django.contrib.auth.models import Group, Permission

    group, _ = Group.objects.get_or_create(name="api managers")
    group.permissions.add(Permission.objects.get(codename="manage_api"))
    person = django_user_model.objects.create_user("meg", password="meg-password", is_staff=True)
    person.groups.add(group)
    return person


@pytest.fixture
def superuser(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("root", password="root-password")


@pytest.fixture
def client_for() -> Callable[[Any], Any]:
    """A REST client signed in as `user` (anonymous for None)."""
    from rest_framework.test import APIClient

    def make(user: Any | None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make


@pytest.fixture
def admin_client_for() -> Callable[[Any], Any]:
    """A browser-like client logged in to the admin as `user`."""
    from django.test import Client

    def make(user: Any) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def make_api(unique_name: str, django_capture_on_commit_callbacks: Any) -> Callable[..., Api]:
    """An API made by the service, its limiter configured in Redis (on commit, run here)."""
    made = 0

    def make(**fields: Any) -> Api:
        nonlocal made
        made += 1
        fields = {
            "name": f"{unique_name}-{made}",
            "base_url": "https://api.example.com/v1",
            "rate": 10.0,
            **fields,
        }
        with django_capture_on_commit_callbacks(execute=True):
            return api_create(**fields)

    return make


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api(credential="api-secret-credential")


@pytest.fixture
def make_job(api: Api, user: Any) -> Callable[..., Job]:
    """A job made by the service; its dispatch (queued on commit) never runs in these tests."""

    def make(calls: int = 3, owner: Any = None, **fields: Any) -> Job:
        specs = [{"method": "GET", "path": f"/items/{i}"} for i in range(calls)]
        fields = {"api": api, "name": "a job", **fields}
        return job_create(owner=owner or user, calls=specs, **fields)

    return make
