"""REST endpoints for jobs: submit a batch of calls (as JSON, or streamed as JSON lines),
follow its progress, its calls and its throttle events, and pause, resume, cancel or retry it.
Users see only their own jobs (404 for anyone else's); superusers see every job
(ratejobs.permissions)."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS
from django.http import StreamingHttpResponse
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import exceptions, generics, serializers, status
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from ratejobs.execution.targets import ALLOWED_METHODS
from ratejobs.limiter.config import MAX_COST
from ratejobs.models import MAX_PRIORITY, Api, Call, CallbackStatus, Job, ThrottleEvent
from ratejobs.permissions import may_delete_records
from ratejobs.rest.errors import Conflict
from ratejobs.rest.parsers import JobJSONParser, JsonCalls, JsonLinesParser, upload_calls
from ratejobs.rest.serializers import NameField, StrictInputSerializer
from ratejobs.rest.throttles import JobCreateThrottle
from ratejobs.selectors.jobs import (
    OUTCOME_LABELS,
    call_get_for_job,
    call_list_for_job,
    call_response_bodies,
    job_get_by_idempotency_key,
    job_get_for_user,
    job_list_for_user,
    job_outcome,
    response_body_output,
    throttle_event_list_for_job,
)
from ratejobs.selectors.results import RESULT_FIELDS, RESULTS_FORMATS, job_results_response
from ratejobs.services.credentials import CREDENTIAL_KEY_SHAPE, KEY_MAX_LENGTH, KEY_MESSAGE
from ratejobs.services.jobs import (
    JobActionRefused,
    calls_check,
    job_act,
    job_submit,
)
from ratejobs.services.retention import JobPurgeRefused, job_purge_request
from ratejobs.uploads import UploadError, job_submit_from_file

IDEMPOTENCY_HEADER = "Idempotency-Key"
# An API's name, a slug (Django's own pattern, with the schema's `$`: matched with fullmatch).
API_NAME_SHAPE = "^[-a-zA-Z0-9_]+$"
# Printable ASCII, as long as the column holding it (also the schema's pattern, hence `$`: the
# key is matched whole with fullmatch).
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"
# Anything but control characters, backslashes and a fragment, what every call's path the
# service takes looks like (it checks more: no other host, no climbing out of the base path).
CALL_PATH_SHAPE = r"^[^\x00-\x1f\x7f\\#]+$"


# -- serializers ---------------------------------------------------------------------------


# The bounds of the numbers a job, a call and an event show are what their columns guarantee.
class JobOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(min_value=1)
    uuid = serializers.UUIDField(
        read_only=True,
        help_text="the key an API's idempotency_header carries for a call is <uuid>-<index>",
    )
    name = serializers.CharField()
    api = serializers.CharField(source="api.name", help_text="the API's name")
    status = serializers.ChoiceField(choices=Job.Status.choices)
    outcome = serializers.SerializerMethodField(
        help_text="the status, with a completed job told apart by how its calls ended: "
        "completed (every call succeeded), completed_with_failures (some failed, or were "
        "cancelled by the deadline), failed (calls failed and none succeeded)"
    )
    priority = serializers.IntegerField(min_value=1, max_value=MAX_PRIORITY)
    total = serializers.IntegerField(min_value=0)
    succeeded = serializers.IntegerField(min_value=0)
    failed = serializers.IntegerField(min_value=0)
    cancelled = serializers.IntegerField(min_value=0)
    throttled = serializers.IntegerField(min_value=0, help_text="429 responses received")
    retries = serializers.IntegerField(min_value=0)
    progress = serializers.FloatField(
        min_value=0, max_value=1, help_text="share of calls finished, 0 to 1"
    )
    created = serializers.DateTimeField()
    not_before = serializers.DateTimeField(allow_null=True)
    deadline = serializers.DateTimeField(allow_null=True)
    credential_key = serializers.CharField(
        max_length=KEY_MAX_LENGTH,
        help_text="the API credential its calls are sent with (a call may name its own); "
        "empty: the API's own",
    )
    started = serializers.DateTimeField(allow_null=True)
    finished = serializers.DateTimeField(allow_null=True)
    callback_url = serializers.CharField(
        max_length=2000, help_text="where the job's summary is POSTed when it finishes; empty: none"
    )
    callback_status = serializers.ChoiceField(
        choices=[("", "none"), *CallbackStatus.choices],
        help_text="the delivery of the job's last finish: empty (no callback, or not finished), "
        "pending (waiting for an attempt), sending, delivered, failed (given up)",
    )
    callback_attempts = serializers.IntegerField(
        min_value=0, help_text="attempts of the current delivery"
    )
    callback_last_error = serializers.CharField(
        max_length=300, help_text="why the last attempt did not deliver; empty: none"
    )
    callback_next_attempt_at = serializers.DateTimeField(
        allow_null=True, help_text="when a pending delivery is tried again"
    )
    callback_delivered_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(serializers.ChoiceField(choices=list(OUTCOME_LABELS.items())))
    def get_outcome(self, job: Job) -> str:
        return job_outcome(job).key


def _credential_key_field(help_text: str) -> serializers.RegexField:
    return serializers.RegexField(
        CREDENTIAL_KEY_SHAPE,
        required=False,
        allow_blank=True,
        max_length=KEY_MAX_LENGTH,
        trim_whitespace=False,
        error_messages={"invalid": KEY_MESSAGE},
        help_text=help_text,
    )


class CallSpecSerializer(StrictInputSerializer):
    """One call of a new job, documentation only: job_create checks each call itself, unknown
    fields included (hence strict: `additionalProperties: false`)."""

    method = serializers.ChoiceField(choices=sorted(ALLOWED_METHODS), default="GET")
    path = serializers.RegexField(
        CALL_PATH_SHAPE, help_text="relative to the API's base URL; never a full URL"
    )
    query = serializers.DictField(
        required=False, allow_null=True, help_text="names to values; a list repeats the name"
    )
    headers = serializers.DictField(
        child=serializers.CharField(),
        required=False,
        allow_null=True,
        help_text="may not override the API's credential header or Authorization",
    )
    json = serializers.JSONField(required=False, help_text="a JSON body (not with body)")
    body = serializers.CharField(
        required=False, allow_null=True, help_text="a text body (not with json)"
    )
    cost = serializers.IntegerField(
        required=False,
        default=0,
        min_value=0,
        max_value=MAX_COST,
        help_text="what the call is expected to cost in the API's cost windows (e.g. estimated "
        "tokens), corrected after the response by its cost_header or cost_json_field; at most "
        "the smallest burst of those windows (400 naming the call otherwise); 0 takes nothing",
    )
    credential_key = _credential_key_field(
        "this call's API credential (POST /api/apis/{name}/credentials/), overriding the "
        "job's: sent with its secret and paced by its own bucket; 400 if the API has no such key"
    )


class CallSpecListField(serializers.Field):
    """The list of calls, passed on as given: the job_create service validates every call and
    names the bad ones by index (a DRF serializer per call would be slow for 100,000 calls)."""

    default_error_messages = {
        "not_a_list": "Expected a list of calls.",
        "empty": "a job needs at least one call",
    }

    def to_internal_value(self, data: Any) -> list[Any] | JsonCalls:
        # JsonCalls: the list as JobJSONParser passes it on, counted and built one at a time.
        if not isinstance(data, list | JsonCalls):
            self.fail("not_a_list")
        if not len(data):  # here too, so that an Idempotency-Key never replays such a body
            self.fail("empty")
        return data


@extend_schema_field(
    {
        "type": "string",
        "pattern": API_NAME_SHAPE,
        "maxLength": Api._meta.get_field("name").max_length,
        "description": "the API's name",
    }
)
class ApiNameField(NameField):
    """An API by its name: a slug, as the schema says (any other name is one no API has)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            shape=API_NAME_SHAPE,
            queryset=Api.objects.all(),
            error_messages={"does_not_exist": 'No API named "{value}".'},
            **kwargs,
        )


class JobUploadParamsSerializer(StrictInputSerializer):
    """The query parameters of an upload: the job's fields other than its calls."""

    api = ApiNameField()
    # \S: a name of spaces only is blank once trimmed
    name = serializers.RegexField(
        r"\S", max_length=Job._meta.get_field("name").max_length, help_text="the job's name"
    )
    priority = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_PRIORITY, help_text="1 (default) to 10"
    )
    not_before = serializers.DateTimeField(
        required=False, help_text="no call is sent before this time (ISO 8601)"
    )
    deadline = serializers.DateTimeField(
        required=False,
        help_text="calls not started by this time are cancelled, with that reason; in the "
        "future, and after not_before",
    )
    credential_key = _credential_key_field(
        "the API credential its calls are sent with (POST /api/apis/{name}/credentials/): its "
        "secret, and a limiter bucket of its own with the API's limits; 400 if the API has no "
        "such key; empty (default): the API's own"
    )
    callback_url = serializers.URLField(
        required=False,
        allow_blank=True,
        max_length=Job._meta.get_field("callback_url").max_length,
        help_text="POST the job's summary here, signed (X-Ratejobs-Signature), each time it "
        "finishes: http(s), no credentials, query or fragment, an address the outbound policy "
        "allows; needs your signing key (POST /api/signing-key/)",
    )


class JobCreateInputSerializer(JobUploadParamsSerializer):
    """A new job: its fields and its calls."""

    calls = CallSpecListField()


class CallSpecListSchema(OpenApiSerializerFieldExtension):
    """At least one call (job_create refuses a job without); each a CallSpec."""

    target_class = CallSpecListField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        call = auto_schema.resolve_serializer(CallSpecSerializer, direction).ref
        return {"type": "array", "items": call, "minItems": 1}


class StatusFilterSerializer(serializers.Serializer):
    def __init__(self, *args: Any, choices: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["status"] = serializers.ChoiceField(choices=choices, required=False)


class CallOutputSerializer(serializers.Serializer):
    """A call without anything that could carry the API's credential: its own headers only."""

    id = serializers.IntegerField(min_value=1)
    index = serializers.IntegerField(min_value=0)
    method = serializers.CharField()
    path = serializers.CharField()
    query = serializers.JSONField(allow_null=True)
    headers = serializers.JSONField(allow_null=True, help_text="the call's own headers")
    status = serializers.ChoiceField(choices=Call.Status.choices)
    attempts = serializers.IntegerField(min_value=0)
    throttled_count = serializers.IntegerField(min_value=0)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    status_code = serializers.IntegerField(allow_null=True, min_value=100, max_value=999)
    error = serializers.CharField()
    duration = serializers.FloatField(
        allow_null=True, min_value=0, help_text="seconds of the last request"
    )
    cost = serializers.IntegerField(
        min_value=0, max_value=MAX_COST, help_text="estimated cost given at submission"
    )
    credential_key = serializers.CharField(
        max_length=KEY_MAX_LENGTH,
        help_text="the call's own API credential key; empty: the job's credential_key",
    )
    cost_used = serializers.IntegerField(
        allow_null=True,
        min_value=0,
        max_value=MAX_COST,
        help_text="what the last response said the call cost (the API's cost_header or "
        "cost_json_field); null: not said",
    )
    response_truncated = serializers.BooleanField()
    response_body = serializers.SerializerMethodField(
        help_text="UTF-8 text, or base64 when response_body_base64 is true; null when there is "
        "none, when response_removed_at is set or, in a list, when response_body_omitted is true"
    )
    response_removed_at = serializers.DateTimeField(
        allow_null=True,
        help_text="when retention removed the stored response body and headers "
        "(RATEJOBS_KEEP_BODIES_DAYS after the job finished); null: not removed",
    )
    response_body_base64 = serializers.SerializerMethodField()
    response_body_omitted = serializers.SerializerMethodField(
        help_text="in a list: the page's bodies reached RATEJOBS_MAX_PAGE_BYTES and this one "
        "was left out; GET /api/jobs/{job_id}/calls/{index}/ returns it"
    )
    started = serializers.DateTimeField(allow_null=True)
    finished = serializers.DateTimeField(allow_null=True)

    def _body(self, call: Call) -> bytes | memoryview | None:
        # A list passes the bodies it loaded within its budget as context; one call has its own.
        bodies = self.context.get("response_bodies")
        return call.response_body if bodies is None else bodies.get(call.pk)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_response_body(self, call: Call) -> str | None:
        return response_body_output(self._body(call), truncated=call.response_truncated)[0]

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_response_body_base64(self, call: Call) -> bool:
        return response_body_output(self._body(call), truncated=call.response_truncated)[1]

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_response_body_omitted(self, call: Call) -> bool:
        bodies = self.context.get("response_bodies")
        return bodies is not None and call.response_body_bytes is not None and call.pk not in bodies


class ConflictSerializer(serializers.Serializer):
    """A 409: the action and the job's status do not go together."""

    detail = serializers.CharField()
    code = serializers.CharField()
    status = serializers.ChoiceField(choices=Job.Status.choices, help_text="the job's status")


class ThrottleEventOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(min_value=1)
    kind = serializers.ChoiceField(choices=ThrottleEvent.Kind.choices)
    call = serializers.IntegerField(source="call_id", allow_null=True, min_value=1)
    status_code = serializers.IntegerField(allow_null=True, min_value=100, max_value=999)
    retry_after = serializers.FloatField(allow_null=True, min_value=0, help_text="seconds")
    rate_before = serializers.FloatField(allow_null=True, min_value=0)
    rate_after = serializers.FloatField(allow_null=True, min_value=0)
    created = serializers.DateTimeField()


def _status_filter(request: Request, choices: Any) -> str | None:
    """The `?status=` of the request, if any; a 400 when it is not one of `choices`."""
    # A plain dict: DRF reads a QueryDict as a form, where an empty `?status=` means "not given".
    given = {"status": request.query_params["status"]} if "status" in request.query_params else {}
    filters = StatusFilterSerializer(data=given, choices=choices)
    filters.is_valid(raise_exception=True)
    return filters.validated_data.get("status")


def _status_parameter(choices: Any) -> OpenApiParameter:
    return OpenApiParameter("status", str, enum=[value for value, _ in choices])


def _idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key, if any; a 400 when it is malformed."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key):
        raise serializers.ValidationError(
            {IDEMPOTENCY_HEADER: ["1 to 200 printable ASCII characters, no spaces."]}
        )
    return key


_IDEMPOTENCY_PARAMETER = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
    OpenApiParameter.HEADER,
    description="a retry with the same key returns the first job (200) instead of making another",
)
_THROTTLED = OpenApiResponse(
    description="more jobs created than RATEJOBS_JOB_CREATE_RATE allows; see Retry-After"
)
_RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    {"type": "integer", "minimum": 0},
    OpenApiParameter.HEADER,
    response=[429],
    description="seconds until you may create a job again",
)


class _JobCreateThrottled:
    """Job creation is throttled per user (JobCreateThrottle), with a 429 that names the rate."""

    def get_throttles(self) -> list[Any]:
        throttles = super().get_throttles()  # type: ignore[misc]
        if self.request.method == "POST":  # type: ignore[attr-defined]
            throttles.append(JobCreateThrottle())
        return throttles

    def throttled(self, request: Request, wait: float | None) -> None:
        raise exceptions.Throttled(
            wait,
            detail=f"Too many jobs created: the limit is {settings.RATEJOBS_JOB_CREATE_RATE} "
            "per user (RATEJOBS_JOB_CREATE_RATE).",
        )


# -- views ---------------------------------------------------------------------------------


class JobListCreateView(_JobCreateThrottled, generics.GenericAPIView):
    queryset = Job.objects.none()  # for the schema; reads go through selectors
    parser_classes = [JobJSONParser]

    def get_serializer_class(self) -> type[serializers.Serializer]:
        # what OPTIONS and the browsable API describe for each method
        if self.request is not None and self.request.method == "POST":
            return JobCreateInputSerializer
        return JobOutputSerializer

    @extend_schema(
        parameters=[_status_parameter(Job.Status.choices)],
        responses=JobOutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        """Your jobs (everyone's for a superuser), newest first; `?status=` filters (400 if
        unknown)."""
        jobs = job_list_for_user(request.user, status=_status_filter(request, Job.Status.choices))
        page = self.paginate_queryset(jobs)
        return self.get_paginated_response(JobOutputSerializer(page, many=True).data)

    @extend_schema(
        request=JobCreateInputSerializer,
        parameters=[_IDEMPOTENCY_PARAMETER, _RETRY_AFTER],
        examples=[
            OpenApiExample(
                "two calls to the API named example",
                value={
                    "api": "example",
                    "name": "nightly sync",
                    "calls": [
                        {"method": "GET", "path": "/users/1", "query": {"fields": "name"}},
                        {"method": "POST", "path": "/users", "json": {"name": "Ada"}},
                    ],
                },
                request_only=True,
            )
        ],
        responses={
            201: JobOutputSerializer,
            200: OpenApiResponse(JobOutputSerializer, "replay of an Idempotency-Key"),
            400: OpenApiResponse(
                description="field errors; calls by index under `calls`; more than "
                "RATEJOBS_MAX_CALLS_PER_REQUEST calls; a limit of yours reached "
                "(RATEJOBS_MAX_ACTIVE_JOBS_PER_USER, RATEJOBS_MAX_PENDING_CALLS_PER_USER)"
            ),
            413: OpenApiResponse(description="request body over RATEJOBS_MAX_REQUEST_BYTES"),
            429: _THROTTLED,
        },
    )
    def post(self, request: Request) -> Response:
        """Submit a job: 201 with the job, every call validated and stored, or a 400 naming
        the bad fields (a bad call by its index under `calls`) and nothing stored.

        At most RATEJOBS_MAX_REQUEST_BYTES of JSON (8 MiB by default) and
        RATEJOBS_MAX_CALLS_PER_REQUEST calls, counted before any is checked; larger jobs go to
        `POST /api/jobs/upload/` as JSON lines.

        With an `Idempotency-Key` header, a retry with a key you already used returns that
        first job with 200 and stores nothing: the new body is not compared with the first
        one, but a body that could not make a job is a 400 all the same."""
        key = _idempotency_key(request)
        # A replay answers only a request that is one: too large is a 413, malformed a 400.
        serializer = JobCreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if key is not None:
            existing = job_get_by_idempotency_key(owner=request.user, key=key)
            if existing is not None:
                fields = serializer.validated_data
                calls_check(api=fields["api"], calls=fields["calls"])
                return Response(JobOutputSerializer(existing).data, status=status.HTTP_200_OK)
        job, created = job_submit(
            owner=request.user, idempotency_key=key, **serializer.validated_data
        )
        return Response(JobOutputSerializer(job).data, status=_created_or_replayed(created))


class JobUploadView(_JobCreateThrottled, APIView):
    parser_classes = [JsonLinesParser]
    # Read by ratejobs.rest.middleware: this route's own body limit, and no spooling of a
    # chunked body, which the view streams itself.
    body_limit_setting = JsonLinesParser.limit_setting
    streams_body = True

    @extend_schema(
        operation_id="jobs_upload",
        # bytes: JSON lines are read line by line, their errors reported by line number
        request={JsonLinesParser.media_type: OpenApiTypes.BINARY},
        parameters=[JobUploadParamsSerializer, _IDEMPOTENCY_PARAMETER, _RETRY_AFTER],
        responses={
            201: JobOutputSerializer,
            200: OpenApiResponse(JobOutputSerializer, "replay of an Idempotency-Key"),
            400: OpenApiResponse(
                description="bad parameters; bad lines by line number under `lines` "
                '(`{"lines": {"7": {"path": ["..."]}}}`); more than '
                "RATEJOBS_MAX_CALLS_PER_UPLOAD calls; a limit of yours reached"
            ),
            413: OpenApiResponse(description="request body over RATEJOBS_MAX_UPLOAD_BYTES"),
            415: OpenApiResponse(description="not application/x-ndjson"),
            429: _THROTTLED,
        },
    )
    def post(self, request: Request) -> Response:
        """Submit a large job as JSON lines (`Content-Type: application/x-ndjson`), one call
        object per line (blank lines skipped), the job's fields as query parameters:
        `?api=NAME&name=JOBNAME&priority=N`. The body is read and stored line by line, with or
        without Content-Length (chunked), up to RATEJOBS_MAX_UPLOAD_BYTES and
        RATEJOBS_MAX_CALLS_PER_UPLOAD calls: 201 with the job, or a 400 naming the bad lines
        and nothing stored. `Idempotency-Key` works as for `POST /api/jobs/`; a replay reads
        no body."""
        key = _idempotency_key(request)
        params = JobUploadParamsSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        if key is not None:
            existing = job_get_by_idempotency_key(owner=request.user, key=key)
            if existing is not None:
                return Response(JobOutputSerializer(existing).data, status=status.HTTP_200_OK)
        try:
            job, created = job_submit_from_file(
                owner=request.user,
                idempotency_key=key,
                calls=upload_calls(request),
                max_calls=settings.RATEJOBS_MAX_CALLS_PER_UPLOAD,
                **params.validated_data,
            )
        except UploadError as exc:  # a Response: a ValidationError would make the count text
            return Response(_errors_by_line(exc), status=status.HTTP_400_BAD_REQUEST)
        return Response(JobOutputSerializer(job).data, status=_created_or_replayed(created))


def _created_or_replayed(created: bool) -> int:
    """201 for a job made now; 200 for the job an Idempotency-Key made before, also when the
    retry ran at the same time as the first request."""
    return status.HTTP_201_CREATED if created else status.HTTP_200_OK


def _errors_by_line(exc: UploadError) -> dict[str, Any]:
    """An upload's errors by the line they are on, `{"lines": {"7": {"path": ["..."]}}}`,
    the first MAX_ERRORS_SHOWN of them, and how many there are in all:
    `"error_count": {"total": 32, "exact": true}` (false: at least that many)."""
    lines: dict[str, dict[str, list[str]]] = {}
    for error in exc.errors:
        field = (
            error.field if error.field != NON_FIELD_ERRORS else api_settings.NON_FIELD_ERRORS_KEY
        )
        lines.setdefault(str(error.line), {}).setdefault(field, []).append(error.message)
    return {"lines": lines, "error_count": {"total": exc.total, "exact": exc.exact}}


class JobDetailView(APIView):
    @extend_schema(responses=JobOutputSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        """One job with its progress."""
        return Response(JobOutputSerializer(job_get_for_user(request.user, job_id)).data)

    @extend_schema(
        request=None,
        responses={
            202: OpenApiResponse(
                description="purge under way: the job is gone from every route at once"
            ),
            403: OpenApiResponse(description="only a superuser may purge a job"),
            404: OpenApiResponse(description="no such job, or not one you may see"),
            409: OpenApiResponse(
                description="the job is not finished (queued, running, paused), or calls of "
                "it are still being sent"
            ),
        },
    )
    def delete(self, request: Request, job_id: int) -> Response:
        """Purge a completed or cancelled job: the job, its calls (with their response bodies),
        throttle events and counts are deleted for good, in the background and in batches.
        Deleting removes results for good, so superusers only (ratejobs.permissions)."""
        job = job_get_for_user(request.user, job_id)
        if not may_delete_records(request.user):
            raise exceptions.PermissionDenied("Only a superuser may purge a job.")
        try:
            job_purge_request(job=job)
        except JobPurgeRefused as exc:
            raise _conflict(exc.job, str(exc)) from exc
        return Response(status=status.HTTP_202_ACCEPTED)


class JobCallListView(generics.GenericAPIView):
    queryset = Call.objects.none()
    serializer_class = CallOutputSerializer

    @extend_schema(
        parameters=[_status_parameter(Call.Status.choices)],
        responses=CallOutputSerializer(many=True),
    )
    def get(self, request: Request, job_id: int) -> Response:
        """The job's calls in index order, `?status=` filters (400 if unknown); 100 a page,
        `?page_size=` up to 1000. Response bodies come in index order up to
        RATEJOBS_MAX_PAGE_BYTES a page (8 MiB by default); the calls after that have
        `response_body: null` and `response_body_omitted: true`: get them one at a time from
        `/api/jobs/{job_id}/calls/{index}/`."""
        job = job_get_for_user(request.user, job_id)
        calls = call_list_for_job(job, status=_status_filter(request, Call.Status.choices))
        page = self.paginate_queryset(calls)
        bodies = call_response_bodies(page, max_bytes=settings.RATEJOBS_MAX_PAGE_BYTES)
        output = CallOutputSerializer(page, many=True, context={"response_bodies": bodies})
        return self.get_paginated_response(output.data)


class JobCallDetailView(APIView):
    @extend_schema(responses=CallOutputSerializer)
    def get(self, request: Request, job_id: int, index: int) -> Response:
        """One call of the job by its index, with its whole stored response body."""
        call = call_get_for_job(job_get_for_user(request.user, job_id), index)
        return Response(CallOutputSerializer(call).data)


class _JsonErrorsWhateverIsAccepted(BaseContentNegotiation):
    """A results file is what it is whatever Accept asks for; an error before it is JSON (no
    406 for `Accept: text/csv`)."""

    def select_renderer(
        self, request: Request, renderers: list[Any], format_suffix: str | None = None
    ) -> tuple[Any, str]:
        return renderers[0], renderers[0].media_type


class _JobResultsView(APIView):
    """GET: the job's results file; see RESULTS_FORMATS for the row format."""

    format_name = ""
    renderer_classes = [JSONRenderer]
    content_negotiation_class = _JsonErrorsWhateverIsAccepted

    def get(self, request: Request, job_id: int) -> StreamingHttpResponse:
        return job_results_response(job_get_for_user(request.user, job_id), self.format_name)


def _results_schema(format_name: str, summary: str) -> Any:
    media_type = RESULTS_FORMATS[format_name].media_type.split(";")[0]
    return extend_schema(
        operation_id=f"jobs_results_{format_name}",
        description=summary
        + " Every call of the job in index order, streamed (a job of a million calls too): "
        f"{', '.join(RESULT_FIELDS)}. The body is the stored response body as UTF-8 text, or "
        "base64 when response_body_base64 is true; empty (null) when there is none or when "
        "response_removed_at says retention removed it. Another user's job is a 404.",
        parameters=[
            OpenApiParameter(
                "Content-Disposition",
                {"type": "string"},
                OpenApiParameter.HEADER,
                response=[200],
                description=f'attachment; filename="job-<id>-results.{format_name}"',
            )
        ],
        responses={(200, media_type): OpenApiResponse(OpenApiTypes.STR, "the results file")},
    )


@extend_schema_view(get=_results_schema("jsonl", "The job's results as JSON lines."))
class JobResultsJsonlView(_JobResultsView):
    format_name = "jsonl"


@extend_schema_view(
    get=_results_schema(
        "csv",
        "The job's results as CSV, a header line first (RFC 4180). A text cell that starts "
        "with =, +, -, @, a tab or a carriage return is written with a leading ' (CSV "
        "injection: a spreadsheet would run it as a formula), a base64 body too; the JSON "
        "lines file gives every value exactly.",
    )
)
class JobResultsCsvView(_JobResultsView):
    format_name = "csv"


class JobThrottleEventListView(generics.GenericAPIView):
    queryset = ThrottleEvent.objects.none()
    serializer_class = ThrottleEventOutputSerializer

    @extend_schema(responses=ThrottleEventOutputSerializer(many=True))
    def get(self, request: Request, job_id: int) -> Response:
        """Throttle events (429s, blocks, rate changes) of the job's calls, newest first."""
        job = job_get_for_user(request.user, job_id)
        page = self.paginate_queryset(throttle_event_list_for_job(job))
        return self.get_paginated_response(ThrottleEventOutputSerializer(page, many=True).data)


def _conflict(job: Job, message: str) -> Conflict:
    return Conflict({"detail": message, "code": "conflict", "status": job.status})


class _JobActionView(APIView):
    """POST with no body: 200 with the job afterwards, 404 for a job you may not see, 409
    (with the job's `status`) when the action makes no sense in the job's current status."""

    action_name = ""

    @extend_schema(
        request=None,
        responses={
            200: JobOutputSerializer,
            409: OpenApiResponse(ConflictSerializer, "the job's status rules the action out"),
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = job_get_for_user(request.user, job_id)
        try:
            job = job_act(job=job, action=self.action_name)
        except JobActionRefused as exc:
            raise _conflict(exc.job, str(exc)) from exc
        return Response(JobOutputSerializer(job).data)


class JobPauseView(_JobActionView):
    """Pause a queued or running job: nothing more is sent until it is resumed (calls already
    being sent finish). 409 when the job is already paused, cancelled or completed."""

    action_name = "pause"


class JobResumeView(_JobActionView):
    """Resume a paused job. 409 for any other status (queued, running, cancelled,
    completed)."""

    action_name = "resume"


class JobCancelView(_JobActionView):
    """Cancel a queued, running or paused job: its calls not yet started are cancelled, calls
    being sent finish and are recorded. 409 when it is already cancelled or completed."""

    action_name = "cancel"


class JobRetryFailedView(_JobActionView):
    """Send the job's failed calls again, with fresh attempts: a completed job runs again, a
    paused one stays paused. 409 when the job is cancelled or has no failed calls."""

    action_name = "retry-failed"
