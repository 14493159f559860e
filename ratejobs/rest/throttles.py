"""Per-user throttles of the REST API, counted in the shared cache (Redis, see CACHES)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from rest_framework.throttling import UserRateThrottle

logger = logging.getLogger(__name__)


class JobCreateThrottle(UserRateThrottle):
    """Jobs a user may create per period, JSON and uploads together: "60/min" and the like
    from settings.RATEJOBS_JOB_CREATE_RATE, read on each request.

    While the cache cannot be reached (its Redis restarting) jobs are taken uncounted: the
    database is the source of truth and stores them to run once Redis is back, and each user's
    unfinished jobs and pending calls are still capped there (RATEJOBS_MAX_ACTIVE_JOBS_PER_USER,
    RATEJOBS_MAX_PENDING_CALLS_PER_USER)."""

    scope = "job_create"

    def get_rate(self) -> str:
        return settings.RATEJOBS_JOB_CREATE_RATE

    def allow_request(self, request: Any, view: Any) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # whatever CACHES names raises its own errors
            logger.warning("job creation throttle: the cache failed, not counting: %s", exc)
            return True
