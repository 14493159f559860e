"""The base views of the REST API: how every route authenticates, parses, paginates, answers
errors and describes itself is set here, not by the project's REST_FRAMEWORK setting, so the
API behaves the same inside a host project whose own DRF defaults differ (say, no auth)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import patched_settings
from drf_spectacular.utils import extend_schema, extend_schema_view
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import generics, views
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer

from ratejobs.rest.authentication import ThrottledTokenAuthentication
from ratejobs.rest.errors import exception_handler
from ratejobs.rest.pagination import Pagination
from ratejobs.rest.parsers import LimitedJSONParser

# The OpenAPI schema's settings, applied while the schema and its pages are served.
SCHEMA_SETTINGS: dict[str, Any] = {
    "TITLE": "ratejobs API",
    "DESCRIPTION": "Batches of outbound HTTP calls against rate-limited APIs.",
    "VERSION": "1.0.0",
    # Swagger UI's files come from drf-spectacular-sidecar (static files), not from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Path parameters as the routes' converters take them (anything else is a 404): ids and
    # indexes up to the largest a 64-bit column holds, names as slugs.
    "PATH_CONVERTER_OVERRIDES": {
        "int": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        "slug": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
    },
    # A job's status shows in a job and in a 409, a call's in a call: one enum each.
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "ratejobs.models.Job.Status",
        "CallStatusEnum": "ratejobs.models.Call.Status",
        "WindowUnitEnum": "ratejobs.limiter.config.WINDOW_UNITS",
    },
    # Every operation lists the errors it can answer, with the API's error body.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ratejobs.rest.schema.add_error_responses",
    ],
}


class RatejobsDefaults:
    # Token first: an anonymous request is then told 401 with `WWW-Authenticate: Token, Bearer`.
    # Bad tokens are throttled per address (ratejobs.login_throttle).
    authentication_classes = [ThrottledTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes = [LimitedJSONParser]
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer]
    throttle_classes: list[type] = []
    pagination_class = Pagination
    schema = AutoSchema()

    def get_exception_handler(self) -> Callable[..., Any]:
        return exception_handler


class APIView(RatejobsDefaults, views.APIView):
    pass


class GenericAPIView(RatejobsDefaults, generics.GenericAPIView):
    pass


@extend_schema_view(get=extend_schema(exclude=True))
class SchemaView(SpectacularAPIView):
    """The schema, with its own settings (a host project's may differ); public, as the routes
    it describes are."""

    authentication_classes = APIView.authentication_classes
    custom_settings = SCHEMA_SETTINGS


class SwaggerView(SpectacularSwaggerView):
    """Swagger UI for the schema above, its files served from the sidecar app."""

    authentication_classes = APIView.authentication_classes

    @extend_schema(exclude=True)
    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        with patched_settings(SCHEMA_SETTINGS):
            return super().get(request, *args, **kwargs)
