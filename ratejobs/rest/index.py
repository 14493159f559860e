"""The REST API's root, `/api/`: where its parts are; and the answer to every path under it that
names no route, a 404 in the API's own JSON (Django's would be an HTML page)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from ratejobs.rest.views import APIView

# The index's links: its key, and the route it points to.
LINKS = {
    "schema": "api:schema",
    "docs": "api:docs",
    "apis": "api:api-list",
    "jobs": "api:job-list",
}


class IndexSerializer(serializers.Serializer):
    schema = serializers.URLField(help_text="this OpenAPI schema")
    docs = serializers.URLField(help_text="its Swagger UI")
    apis = serializers.URLField(help_text="third-party APIs and their limits")
    jobs = serializers.URLField(help_text="your jobs; POST one here")


class IndexView(APIView):
    """Public, like the schema and its docs: links only, nothing that needs signing in."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(operation_id="index", responses=IndexSerializer)
    def get(self, request: Request) -> Response:
        """Where the REST API's schema, docs, APIs and jobs are."""
        return Response({key: reverse(name, request=request) for key, name in LINKS.items()})


@csrf_exempt  # a 404 for every method; CSRF's 403 page would hide it
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    detail = "Not found."
    if not request.path_info.endswith("/") and _is_route(request.path_info + "/"):
        # The routes end with a slash; Django's APPEND_SLASH redirect cannot keep a POST's body.
        detail = f"Not found. Did you mean {request.path_info}/ (with a trailing slash)?"
    return JsonResponse({"detail": detail}, status=404)


def _is_route(path: str) -> bool:
    try:
        return resolve(path).func is not not_found
    except Resolver404:
        return False
