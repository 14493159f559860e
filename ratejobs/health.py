"""`/healthz`: whether this deployment can serve, for container and load-balancer checks."""

from __future__ import annotations

import logging

from django.http import HttpRequest, JsonResponse

from ratejobs.selectors.health import DOWN, OK, deployment_health

logger = logging.getLogger(__name__)


def health_view(request: HttpRequest) -> JsonResponse:
    """Each part's state as JSON: {"status": "ok"|"degraded"|"down", "namespace", "checks"}.
    503 when a required part (the database, Redis, the broker; the workers only with
    RATEJOBS_HEALTH_REQUIRE_WORKERS) is down, else 200, "degraded" naming what is missing.
    Why a part is down is in the log, and in the answer only for staff: probers are
    anonymous, and the drivers' messages name internal hosts and ports."""
    report = deployment_health()
    for name, part in report.checks.items():
        if part.status != OK and part.error:
            logger.warning("health: %s is down: %s", name, part.error)
    status = 503 if report.status == DOWN else 200
    staff = request.user.is_authenticated and request.user.is_staff
    response = JsonResponse(report.as_json(errors=staff), status=status)
    response["Cache-Control"] = "no-store"
    return response
