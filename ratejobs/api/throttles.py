"""Per-user throttles of the REST API, counted in the shared cache (Redis, see CACHES)."""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import UserRateThrottle


class JobCreateThrottle(UserRateThrottle):
    """Jobs a user may create per period, JSON and uploads together: "60/min" and the like
    from settings.RATEJOBS_JOB_CREATE_RATE, read on each request."""

    scope = "job_create"

    def get_rate(self) -> str:
        return settings.RATEJOBS_JOB_CREATE_RATE
