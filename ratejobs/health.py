"""`/healthz`: whether this deployment can serve, for container and load-balancer checks."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from ratejobs.selectors.health import DOWN, deployment_health


def health_view(request: HttpRequest) -> JsonResponse:
    """Each part's state as JSON: {"status": "ok"|"degraded"|"down", "namespace", "checks"}.
    503 when a required part (the database, Redis, the broker; the workers only with
    RATEJOBS_HEALTH_REQUIRE_WORKERS) is down, else 200, "degraded" naming what is missing."""
    report = deployment_health()
    status = 503 if report.status == DOWN else 200
    response = JsonResponse(report.as_json(), status=status)
    response["Cache-Control"] = "no-store"
    return response
