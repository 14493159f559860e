"""Security tests run as an attacker with an ordinary account would: through the real REST
routes, admin pages, services and worker code, against real servers on loopback."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _every_security_test_uses_the_test_redis(
    services_redis: None, throttles_in_the_test_redis: None
) -> None:
    """The limiter of every API made here, and the REST throttle, live in the test Redis."""
