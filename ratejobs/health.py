"""`/healthz`: whether this web process can serve, for container and load-balancer checks."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse


def health_view(request: HttpRequest) -> HttpResponse:
    """200 when the database answers. Redis is not asked: without it the admin and the REST
    API still work (only the limiter state and dispatch wait), so the web stays in service."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any driver error means the same thing here
        return HttpResponse(f"database unavailable: {type(exc).__name__}\n", status=503)
    return HttpResponse("ok\n", content_type="text/plain")
