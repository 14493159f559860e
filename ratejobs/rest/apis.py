"""REST endpoints for third-party APIs: anyone signed in lists and reads them with the live
state of their shared limiter; managers (ratejobs.permissions) create them and change them
live."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import Group
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from ratejobs.execution.request import MASK
from ratejobs.execution.targets import HEADER_NAME_PATTERN
from ratejobs.limiter.config import (
    MAX_BURST,
    MAX_CONCURRENCY,
    MAX_PERIOD,
    MAX_RATE,
    MAX_WINDOWS,
    WINDOW_UNITS,
)
from ratejobs.models import (
    MAX_ATTEMPTS,
    MAX_THROTTLED_RETRIES,
    MAX_TIMEOUT,
    MIN_PERIOD,
    MIN_RATE,
    MIN_TIMEOUT,
    Api,
)
from ratejobs.permissions import can_manage_apis
from ratejobs.rest.serializers import NameField, StrictInputSerializer
from ratejobs.rest.views import GenericAPIView
from ratejobs.selectors.apis import api_get, api_limiter_readings, api_list
from ratejobs.services.apis import api_create, api_update

IDEMPOTENCY_HEADER_HELP = (
    "header sent with the same key on every attempt of a call (job uuid and call index), so an "
    "API that deduplicates by it (Stripe's Idempotency-Key) acts on each call once; a call's own "
    "header of that name wins; empty: none sent"
)


LIMITS_HELP = (
    "windows besides rate/period/burst, every one of which a call must fit (atomically): an "
    "hourly and a daily quota, tokens per minute; at most "
    f'{MAX_WINDOWS}. unit "cost" counts each call\'s cost (tokens) instead of requests'
)
COST_HEADER_HELP = (
    "response header carrying what a call really cost (e.g. X-Tokens-Used): the difference "
    "from its estimated cost is charged or refunded to the cost windows; empty: none"
)
COST_JSON_FIELD_HELP = (
    "dotted path to what a call really cost in a JSON response (e.g. usage.total_tokens), used "
    "when cost_header gives nothing; a number segment indexes a list; empty: none"
)
# What the service's check of a cost_json_field allows (ratejobs.limiter.cost), for the schema.
COST_JSON_FIELD_SHAPE = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"


class WindowSerializer(StrictInputSerializer):
    """One window: `rate` units per `period` seconds, up to `burst` at once (as the main rate;
    rate / period is bounded as there)."""

    rate = serializers.FloatField(
        min_value=MIN_RATE, max_value=MAX_RATE, help_text="units per period"
    )
    period = serializers.FloatField(min_value=MIN_PERIOD, max_value=MAX_PERIOD, help_text="seconds")
    burst = serializers.IntegerField(
        min_value=1, max_value=MAX_BURST, help_text="units that may go at once"
    )
    unit = serializers.ChoiceField(
        choices=list(WINDOW_UNITS),
        default="requests",
        help_text="requests: each call counts 1; cost: each call counts its cost (tokens)",
    )


class WindowStateSerializer(serializers.Serializer):
    label = serializers.CharField(source="window.label", help_text='e.g. "300/60s"')
    rate = serializers.FloatField(source="window.rate")
    period = serializers.FloatField(source="window.period")
    burst = serializers.IntegerField(source="window.burst", min_value=1)
    unit = serializers.ChoiceField(source="window.unit", choices=list(WINDOW_UNITS))
    remaining = serializers.FloatField(min_value=0, help_text="units that may go now")
    next_free_in = serializers.FloatField(min_value=0, help_text="seconds until one more unit")
    full_in = serializers.FloatField(
        min_value=0, help_text="seconds until the whole burst is back (the quota refilled)"
    )


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
    learned_rate = serializers.FloatField(
        allow_null=True,
        min_value=0,
        help_text="adaptive: the API's real limit learned from its throttles, requests per "
        "period; null until one was measured",
    )
    windows = WindowStateSerializer(
        many=True, help_text="each of the API's limits besides the main rate, as it stands now"
    )


class ApiOutputSerializer(serializers.Serializer):
    """An API as the REST API shows it: never its credential, only whether it has one.

    Context: `readings` (selectors.apis.api_limiter_readings of the APIs shown) and
    `can_manage` (others see default header names with their values masked)."""

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
    idempotency_header = serializers.CharField(help_text=IDEMPOTENCY_HEADER_HELP)
    limits = WindowSerializer(many=True, help_text=LIMITS_HELP)
    cost_header = serializers.CharField(help_text=COST_HEADER_HELP)
    cost_json_field = serializers.CharField(help_text=COST_JSON_FIELD_HELP)
    credential_env = serializers.CharField()
    has_credential = serializers.BooleanField()
    submitter_groups = serializers.SerializerMethodField(
        help_text="groups whose members (and managers) may submit jobs to it; empty: everyone"
    )
    created = serializers.DateTimeField()
    updated = serializers.DateTimeField()
    limiter = serializers.SerializerMethodField()
    limiter_error = serializers.SerializerMethodField()

    @extend_schema_field(serializers.DictField(child=serializers.CharField()))
    def get_default_headers(self, api: Api) -> dict[str, str]:
        if self.context.get("can_manage"):
            return api.default_headers
        return dict.fromkeys(api.default_headers, MASK)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_submitter_groups(self, api: Api) -> list[str]:
        return sorted(group.name for group in api.submitter_groups.all())

    @extend_schema_field(LimiterStateSerializer(allow_null=True))
    def get_limiter(self, api: Api) -> dict[str, Any] | None:
        reading = self.context["readings"][api.pk]
        return None if reading.state is None else LimiterStateSerializer(reading.state).data

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_limiter_error(self, api: Api) -> str | None:
        return self.context["readings"][api.pk].error


# What every base URL the services take looks like (they check more: a host that resolves
# where the outbound policy allows, a port in range, no dot segments), for the schema and for a
# quick 400: http(s), and no spaces, backslashes, control characters, query or fragment.
BASE_URL_SHAPE = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\x00-\x20\x7f\\?#]+\Z"
# A credential's environment variable: a C identifier (or empty for none, allow_blank).
CREDENTIAL_ENV_SHAPE = r"^[A-Za-z_][A-Za-z0-9_]*\Z"


def _shaped(column: str, pattern: str, invalid: str, **kwargs: Any) -> serializers.RegexField:
    """A text field of the pattern (the schema shows it), as long as the model's column."""
    return serializers.RegexField(
        pattern,
        max_length=Api._meta.get_field(column).max_length,
        trim_whitespace=False,  # spaces around it are refused, as the pattern says, not trimmed
        error_messages={"invalid": invalid},
        **kwargs,
    )


def _base_url_field(**kwargs: Any) -> serializers.RegexField:
    return _shaped(
        "base_url", BASE_URL_SHAPE, "must be an http:// or https:// URL without a query", **kwargs
    )


class ApiUpdateInputSerializer(StrictInputSerializer):
    """Fields left out keep their value; the services check the values."""

    # The bounds are documented in the schema; the model's validators enforce them (and
    # rate / period within the limiter's range) for every way in.
    base_url = _base_url_field(required=False)
    rate = serializers.FloatField(required=False, min_value=MIN_RATE, max_value=MAX_RATE)
    period = serializers.FloatField(required=False, min_value=MIN_PERIOD, max_value=MAX_PERIOD)
    burst = serializers.IntegerField(required=False, min_value=1, max_value=MAX_BURST)
    max_concurrency = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_CONCURRENCY
    )
    adaptive = serializers.BooleanField(required=False)
    min_rate = serializers.FloatField(
        required=False, allow_null=True, min_value=MIN_RATE, max_value=MAX_RATE
    )
    max_attempts = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ATTEMPTS)
    max_throttled_retries = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_THROTTLED_RETRIES
    )
    timeout = serializers.FloatField(required=False, min_value=MIN_TIMEOUT, max_value=MAX_TIMEOUT)
    default_headers = serializers.DictField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True), required=False
    )
    auth_header = _shaped(
        "auth_header",
        HEADER_NAME_PATTERN,
        "must be a header name (an HTTP token)",
        required=False,
    )
    idempotency_header = _shaped(
        "idempotency_header",
        HEADER_NAME_PATTERN,
        "must be a header name (an HTTP token), or empty for none",
        required=False,
        allow_blank=True,
        help_text=IDEMPOTENCY_HEADER_HELP,
    )
    limits = serializers.ListField(
        child=WindowSerializer(),
        required=False,
        max_length=MAX_WINDOWS,
        help_text=LIMITS_HELP + "; the list given replaces the API's ([] removes them all)",
    )
    cost_header = _shaped(
        "cost_header",
        HEADER_NAME_PATTERN,
        "must be a header name (an HTTP token), or empty for none",
        required=False,
        allow_blank=True,
        help_text=COST_HEADER_HELP,
    )
    cost_json_field = _shaped(
        "cost_json_field",
        COST_JSON_FIELD_SHAPE,
        "must be a dotted path such as usage.total_tokens, or empty for none",
        required=False,
        allow_blank=True,
        help_text=COST_JSON_FIELD_HELP,
    )
    credential_env = _shaped(
        "credential_env",
        CREDENTIAL_ENV_SHAPE,
        "must be an environment variable's name",
        required=False,
        allow_blank=True,
    )
    submitter_groups = NameField(
        many=True,
        required=False,
        queryset=Group.objects.all(),
        help_text="names of the groups whose members (and managers) may submit jobs to it; "
        "empty: everyone signed in",
    )
    credential = serializers.CharField(
        required=False,
        allow_blank=True,
        write_only=True,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="Write-only: stored encrypted, never returned; an empty string removes it.",
    )


class ApiCreateInputSerializer(ApiUpdateInputSerializer):
    name = serializers.SlugField(
        max_length=Api._meta.get_field("name").max_length,
        trim_whitespace=False,
        help_text="a slug; also the shared limiter's name",
    )
    base_url = _base_url_field()
    rate = serializers.FloatField(
        help_text="requests per period", min_value=MIN_RATE, max_value=MAX_RATE
    )


def _represent(request: Request, apis: Sequence[Api]) -> Any:
    context = {"readings": api_limiter_readings(apis), "can_manage": can_manage_apis(request.user)}
    return ApiOutputSerializer(apis, many=True, context=context).data


class CanManageApis(BasePermission):
    message = (
        "Only API managers may create or change APIs: superusers and holders of the "
        "ratejobs.manage_api permission."
    )

    def has_permission(self, request: Request, view: Any) -> bool:
        return can_manage_apis(request.user)


class _ManagerWrites:
    """Reading needs a signed-in user; writing needs a manager (403 otherwise)."""

    def get_permissions(self) -> list[Any]:
        if self.request.method in ("GET", "HEAD", "OPTIONS"):
            return [IsAuthenticated()]
        return [IsAuthenticated(), CanManageApis()]


class ApiListCreateView(_ManagerWrites, GenericAPIView):
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
        page = self.paginate_queryset(api_list().prefetch_related("submitter_groups"))
        return self.get_paginated_response(_represent(request, page))

    @extend_schema(
        request=ApiCreateInputSerializer,
        responses={201: ApiOutputSerializer},
        examples=[
            OpenApiExample(
                "an API allowing 5,000 requests an hour",
                value={
                    "name": "example",
                    "base_url": "https://api.example.com/v1",
                    "rate": 5000,
                    "period": 3600,
                    "burst": 50,
                },
                request_only=True,
            )
        ],
    )
    def post(self, request: Request) -> Response:
        """Create an API (managers only). `credential` is stored encrypted and never returned."""
        serializer = ApiCreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        api = api_create(**serializer.validated_data)
        return Response(_represent(request, [api])[0], status=status.HTTP_201_CREATED)


class ApiDetailView(_ManagerWrites, GenericAPIView):
    def get_serializer_class(self) -> type[serializers.Serializer]:
        if self.request is not None and self.request.method == "PATCH":
            return ApiUpdateInputSerializer
        return ApiOutputSerializer

    def get(self, request: Request, name: str) -> Response:
        """One API with its live limiter state."""
        return Response(_represent(request, [api_get(name=name)])[0])

    @extend_schema(request=ApiUpdateInputSerializer, responses=ApiOutputSerializer)
    def patch(self, request: Request, name: str) -> Response:
        """Change an API's limits (managers only); workers use them from their next grant on.
        The name cannot change (it is the limiter's name)."""
        api = api_get(name=name)
        serializer = ApiUpdateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        api = api_update(api=api, **serializer.validated_data)
        return Response(_represent(request, [api])[0])
