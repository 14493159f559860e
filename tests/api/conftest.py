"""Users, API clients, APIs whose limiters live in the test Redis, and jobs made by the
services; requests go through the real URL routes, views and database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from ratejobs import devredis
from ratejobs.models import Api, Job
from ratejobs.services import apis as api_services
from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create


def _forget_redis_clients() -> None:
    """Drop the process's cached Redis client and limiters so the next use reads REDIS_URL."""
    if api_services.redis_client.cache_info().currsize:
        api_services.redis_client().connection_pool.disconnect()
    api_services.redis_client.cache_clear()
    api_services._limiters.clear()


@pytest.fixture(autouse=True)
def test_redis(redis_url: str, redis_client: Any, unique_name: str, db: None) -> Iterator[None]:
    """Every API test talks to the test Redis; the limiter keys of its APIs (all named after
    `unique_name`) are removed afterwards."""
    _forget_redis_clients()
    yield
    keys = list(redis_client.scan_iter(match=f"ratejobs:limiter:{{{unique_name}*"))
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
def client_for() -> Callable[[Any], APIClient]:
    def make(user: Any | None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make


@pytest.fixture
def api_client(client_for: Callable[[Any], APIClient], user: Any) -> APIClient:
    return client_for(user)


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
