"""Users, API clients, APIs whose limiters live in the test Redis, and jobs made by the
services; requests go through the real URL routes, views and database."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.rest.realserver import web_server  # noqa: F401 (fixture)


@pytest.fixture(autouse=True)
def _every_api_test_uses_the_test_redis(
    services_redis: None, throttles_in_the_test_redis: None
) -> None:
    """Every API test talks to the test Redis (see services_redis), its throttle too."""


@pytest.fixture
def api_client(client_for: Callable[[Any], APIClient], user: Any) -> APIClient:
    return client_for(user)
