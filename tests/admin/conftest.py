"""Admin pages driven through Django's test client: real URL routes, templates, database and
the test Redis behind the limiter state."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client


@pytest.fixture(autouse=True)
def _every_admin_test_uses_the_test_redis(services_redis: None) -> None:
    """Every admin test talks to the test Redis (see services_redis)."""


@pytest.fixture
def root_client(admin_client_for: Any, superuser: Any) -> Client:
    return admin_client_for(superuser)
