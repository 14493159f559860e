"""REST endpoints for third-party APIs: anyone signed in lists and reads them with the live
state of their shared limiter; staff create them and change their limits live."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.permissions import IsAdminUser, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from ratejobs.api.serializers import StrictInputSerializer
from ratejobs.models import Api
from ratejobs.selectors.apis import api_get, api_limiter_readings, api_list
from ratejobs.services.apis import api_create, api_update

# What non-staff users see instead of a default header's value: it may be an API key.
REDACTED = "***"


class LimiterStateSerializer(serializers.Serializer):
    configured = serializers.BooleanField(help_text="false: Redis holds no limits for it yet")
    rate = serializers.FloatField(help_text="configured ceiling, requests per period")
    current_rate = serializers.FloatField(help_text="requests per period now (adaptive cuts)")
    period = serializers.FloatField()
    burst = serializers.IntegerField()
    max_concurrency = serializers.IntegerField()
    adaptive = serializers.BooleanField()
    min_rate = serializers.FloatField()
    blocked_for = serializers.FloatField(help_text="seconds until a block ends; 0: none")
    next_free_in = serializers.FloatField(help_text="seconds until the next free slot")
    in_flight = serializers.IntegerField()
    generation = serializers.IntegerField()


class ApiOutputSerializer(serializers.Serializer):
    """An API as the REST API shows it: never its credential, only whether it has one.

    Context: `readings` (selectors.apis.api_limiter_readings of the APIs shown) and
    `is_staff` (others see default header names with their values redacted)."""

    name = serializers.CharField()
    base_url = serializers.CharField()
    rate = serializers.FloatField()
    period = serializers.FloatField()
    burst = serializers.IntegerField()
    max_concurrency = serializers.IntegerField()
    adaptive = serializers.BooleanField()
    min_rate = serializers.FloatField(allow_null=True)
    max_attempts = serializers.IntegerField()
    max_throttled_retries = serializers.IntegerField()
    timeout = serializers.FloatField()
    default_headers = serializers.SerializerMethodField()
    auth_header = serializers.CharField()
    credential_env = serializers.CharField()
    has_credential = serializers.BooleanField()
    created = serializers.DateTimeField()
    updated = serializers.DateTimeField()
    limiter = serializers.SerializerMethodField()
    limiter_error = serializers.SerializerMethodField()

    @extend_schema_field(serializers.DictField(child=serializers.CharField()))
    def get_default_headers(self, api: Api) -> dict[str, str]:
        if self.context.get("is_staff"):
            return api.default_headers
        return dict.fromkeys(api.default_headers, REDACTED)

    @extend_schema_field(LimiterStateSerializer(allow_null=True))
    def get_limiter(self, api: Api) -> dict[str, Any] | None:
        reading = self.context["readings"][api.pk]
        return None if reading.state is None else LimiterStateSerializer(reading.state).data

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_limiter_error(self, api: Api) -> str | None:
        return self.context["readings"][api.pk].error


class ApiUpdateInputSerializer(StrictInputSerializer):
    """Fields left out keep their value; the services check the values."""

    base_url = serializers.CharField(required=False)
    rate = serializers.FloatField(required=False)
    period = serializers.FloatField(required=False)
    burst = serializers.IntegerField(required=False)
    max_concurrency = serializers.IntegerField(required=False)
    adaptive = serializers.BooleanField(required=False)
    min_rate = serializers.FloatField(required=False, allow_null=True)
    max_attempts = serializers.IntegerField(required=False)
    max_throttled_retries = serializers.IntegerField(required=False)
    timeout = serializers.FloatField(required=False)
    default_headers = serializers.DictField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True), required=False
    )
    auth_header = serializers.CharField(required=False)
    credential_env = serializers.CharField(required=False, allow_blank=True)
    credential = serializers.CharField(
        required=False,
        allow_blank=True,
        write_only=True,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="Write-only: stored encrypted, never returned; an empty string removes it.",
    )


class ApiCreateInputSerializer(ApiUpdateInputSerializer):
    name = serializers.CharField(help_text="a slug; also the shared limiter's name")
    base_url = serializers.CharField()
    rate = serializers.FloatField(help_text="requests per period")


def _represent(request: Request, apis: Sequence[Api]) -> Any:
    context = {"readings": api_limiter_readings(apis), "is_staff": request.user.is_staff}
    return ApiOutputSerializer(apis, many=True, context=context).data


class _StaffWrites:
    """Reading needs a signed-in user; writing needs staff (403 otherwise)."""

    def get_permissions(self) -> list[Any]:
        if self.request.method in ("GET", "HEAD", "OPTIONS"):
            return [IsAuthenticated()]
        return [IsAuthenticated(), IsAdminUser()]


class ApiListCreateView(_StaffWrites, generics.GenericAPIView):
    queryset = Api.objects.none()  # for the schema; reads go through selectors

    def get_serializer_class(self) -> type[serializers.Serializer]:
        # what OPTIONS and the browsable API describe for each method
        if self.request is not None and self.request.method == "POST":
            return ApiCreateInputSerializer
        return ApiOutputSerializer

    @extend_schema(responses=ApiOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        """APIs by name, each with its live limiter state (`limiter` is null and
        `limiter_error` says why when Redis cannot be reached)."""
        page = self.paginate_queryset(api_list())
        return self.get_paginated_response(_represent(request, page))

    @extend_schema(request=ApiCreateInputSerializer, responses={201: ApiOutputSerializer})
    def post(self, request: Request) -> Response:
        """Create an API (staff only). `credential` is stored encrypted and never returned."""
        serializer = ApiCreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        api = api_create(**serializer.validated_data)
        return Response(_represent(request, [api])[0], status=status.HTTP_201_CREATED)


class ApiDetailView(_StaffWrites, generics.GenericAPIView):
    def get_serializer_class(self) -> type[serializers.Serializer]:
        if self.request is not None and self.request.method == "PATCH":
            return ApiUpdateInputSerializer
        return ApiOutputSerializer

    def get(self, request: Request, name: str) -> Response:
        """One API with its live limiter state."""
        return Response(_represent(request, [api_get(name=name)])[0])

    @extend_schema(request=ApiUpdateInputSerializer, responses=ApiOutputSerializer)
    def patch(self, request: Request, name: str) -> Response:
        """Change an API's limits (staff only); workers use them from their next grant on.
        The name cannot change (it is the limiter's name)."""
        api = api_get(name=name)
        serializer = ApiUpdateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        api = api_update(api=api, **serializer.validated_data)
        return Response(_represent(request, [api])[0])
