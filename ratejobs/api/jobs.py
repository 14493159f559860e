"""REST endpoints for jobs: submit a batch of calls (as JSON, or streamed as JSON lines),
follow its progress, its calls and its throttle events, and pause, resume, cancel or retry it.
Users see only their own jobs (404 for anyone else's); superusers see every job
(ratejobs.permissions)."""

from __future__ import annotations

import base64
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import exceptions, generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from ratejobs.api.errors import Conflict
from ratejobs.api.parsers import JobJSONParser, JsonCalls, JsonLinesParser, upload_calls
from ratejobs.api.serializers import StrictInputSerializer
from ratejobs.api.throttles import JobCreateThrottle
from ratejobs.execution.urls import ALLOWED_METHODS
from ratejobs.models import Api, Call, Job, ThrottleEvent
from ratejobs.selectors.jobs import (
    call_get_for_job,
    call_list_for_job,
    call_response_bodies,
    job_get_by_idempotency_key,
    job_get_for_user,
    job_list_for_user,
    response_body_text,
    throttle_event_list_for_job,
)
from ratejobs.services.jobs import CallsInvalid, JobActionRefused, job_act, job_submit
from ratejobs.uploads import NumberedCalls, UploadError

IDEMPOTENCY_HEADER = "Idempotency-Key"
# Printable ASCII, as long as the column holding it.
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")


# -- serializers ---------------------------------------------------------------------------


class JobOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    api = serializers.CharField(source="api.name", help_text="the API's name")
    status = serializers.ChoiceField(choices=Job.Status.choices)
    priority = serializers.IntegerField()
    total = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    throttled = serializers.IntegerField(help_text="429 responses received")
    retries = serializers.IntegerField()
    progress = serializers.FloatField(help_text="share of calls finished, 0 to 1")
    created = serializers.DateTimeField()
    started = serializers.DateTimeField(allow_null=True)
    finished = serializers.DateTimeField(allow_null=True)


class CallSpecSerializer(serializers.Serializer):
    """One call of a new job, documentation only: job_create checks each call itself."""

    method = serializers.ChoiceField(choices=sorted(ALLOWED_METHODS), default="GET")
    path = serializers.CharField(help_text="relative to the API's base URL; never a full URL")
    query = serializers.DictField(required=False)
    headers = serializers.DictField(
        child=serializers.CharField(),
        required=False,
        help_text="may not override the API's credential header or Authorization",
    )
    json = serializers.JSONField(required=False, help_text="a JSON body (not with body)")
    body = serializers.CharField(required=False, help_text="a text body (not with json)")


@extend_schema_field(CallSpecSerializer(many=True))
class CallSpecListField(serializers.Field):
    """The list of calls, passed on as given: the job_create service validates every call and
    names the bad ones by index (a DRF serializer per call would be slow for 100,000 calls)."""

    default_error_messages = {"not_a_list": "Expected a list of calls."}

    def to_internal_value(self, data: Any) -> list[Any] | JsonCalls:
        # JsonCalls: the list as JobJSONParser passes it on, counted and built one at a time.
        if not isinstance(data, list | JsonCalls):
            self.fail("not_a_list")
        return data


class JobCreateInputSerializer(StrictInputSerializer):
    api = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Api.objects.all(),
        error_messages={"does_not_exist": 'No API named "{value}".'},
        help_text="the API's name",
    )
    name = serializers.CharField()
    priority = serializers.IntegerField(required=False, help_text="1 (default) to 10")
    calls = CallSpecListField()


class JobUploadParamsSerializer(StrictInputSerializer):
    """The query parameters of an upload: the job's fields other than its calls."""

    api = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Api.objects.all(),
        error_messages={"does_not_exist": 'No API named "{value}".'},
        help_text="the API's name",
    )
    name = serializers.CharField(help_text="the job's name")
    priority = serializers.IntegerField(required=False, help_text="1 (default) to 10")


class StatusFilterSerializer(serializers.Serializer):
    def __init__(self, *args: Any, choices: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["status"] = serializers.ChoiceField(choices=choices, required=False)


class CallOutputSerializer(serializers.Serializer):
    """A call without anything that could carry the API's credential: its own headers only."""

    id = serializers.IntegerField()
    index = serializers.IntegerField()
    method = serializers.CharField()
    path = serializers.CharField()
    query = serializers.JSONField(allow_null=True)
    headers = serializers.JSONField(allow_null=True, help_text="the call's own headers")
    status = serializers.ChoiceField(choices=Call.Status.choices)
    attempts = serializers.IntegerField()
    throttled_count = serializers.IntegerField()
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    status_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    duration = serializers.FloatField(allow_null=True, help_text="seconds of the last request")
    response_truncated = serializers.BooleanField()
    response_body = serializers.SerializerMethodField(
        help_text="UTF-8 text, or base64 when response_body_base64 is true; null when there is "
        "none or, in a list, when response_body_omitted is true"
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
        body = self._body(call)
        text = response_body_text(body, truncated=call.response_truncated)
        if text is None and body is not None:
            return base64.b64encode(bytes(body)).decode("ascii")
        return text

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_response_body_base64(self, call: Call) -> bool:
        body = self._body(call)
        return (
            body is not None and response_body_text(body, truncated=call.response_truncated) is None
        )

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_response_body_omitted(self, call: Call) -> bool:
        bodies = self.context.get("response_bodies")
        return bodies is not None and call.response_body_bytes is not None and call.pk not in bodies


class ThrottleEventOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=ThrottleEvent.Kind.choices)
    call = serializers.IntegerField(source="call_id", allow_null=True)
    status_code = serializers.IntegerField(allow_null=True)
    retry_after = serializers.FloatField(allow_null=True, help_text="seconds")
    rate_before = serializers.FloatField(allow_null=True)
    rate_after = serializers.FloatField(allow_null=True)
    created = serializers.DateTimeField()


def _status_filter(request: Request, choices: Any) -> str | None:
    """The `?status=` of the request, if any; a 400 when it is not one of `choices`."""
    filters = StatusFilterSerializer(data=request.query_params, choices=choices)
    filters.is_valid(raise_exception=True)
    return filters.validated_data.get("status")


def _status_parameter(choices: Any) -> OpenApiParameter:
    return OpenApiParameter("status", str, enum=[value for value, _ in choices])


def _idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key, if any; a 400 when it is malformed."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not _IDEMPOTENCY_KEY.match(key):
        raise serializers.ValidationError(
            {IDEMPOTENCY_HEADER: ["1 to 200 printable ASCII characters, no spaces."]}
        )
    return key


_IDEMPOTENCY_PARAMETER = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    str,
    OpenApiParameter.HEADER,
    description="a retry with the same key returns the first job (200) instead of making another",
)
_THROTTLED = OpenApiResponse(
    description="more jobs created than RATEJOBS_JOB_CREATE_RATE allows; see Retry-After"
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
        parameters=[_IDEMPOTENCY_PARAMETER],
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
        first job with 200 (whatever the new body says) and stores nothing."""
        key = _idempotency_key(request)
        data = request.data  # parsing first: an oversize body is a 413 even when replayed
        if key is not None:
            existing = job_get_by_idempotency_key(owner=request.user, key=key)
            if existing is not None:
                return Response(JobOutputSerializer(existing).data, status=status.HTTP_200_OK)
        serializer = JobCreateInputSerializer(data=data)
        serializer.is_valid(raise_exception=True)
        job, created = job_submit(
            owner=request.user, idempotency_key=key, **serializer.validated_data
        )
        return Response(JobOutputSerializer(job).data, status=_created_or_replayed(created))


class JobUploadView(_JobCreateThrottled, APIView):
    parser_classes = [JsonLinesParser]
    # Read by ratejobs.api.middleware: this route's own body limit, and no spooling of a
    # chunked body, which the view streams itself.
    body_limit_setting = JsonLinesParser.limit_setting
    streams_body = True

    @extend_schema(
        operation_id="jobs_upload",
        request={JsonLinesParser.media_type: OpenApiTypes.STR},
        parameters=[
            OpenApiParameter("api", str, required=True, description="the API's name"),
            OpenApiParameter("name", str, required=True, description="the job's name"),
            OpenApiParameter("priority", int, description="1 (default) to 10"),
            _IDEMPOTENCY_PARAMETER,
        ],
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
        calls = upload_calls(request)
        try:
            job, created = job_submit(
                owner=request.user,
                idempotency_key=key,
                calls=calls,
                max_calls=settings.RATEJOBS_MAX_CALLS_PER_UPLOAD,
                **params.validated_data,
            )
        except (UploadError, CallsInvalid) as exc:
            raise serializers.ValidationError({"lines": _errors_by_line(calls, exc)}) from exc
        return Response(JobOutputSerializer(job).data, status=_created_or_replayed(created))


def _created_or_replayed(created: bool) -> int:
    """201 for a job made now; 200 for the job an Idempotency-Key made before, also when the
    retry ran at the same time as the first request."""
    return status.HTTP_201_CREATED if created else status.HTTP_200_OK


def _errors_by_line(calls: NumberedCalls, exc: UploadError | CallsInvalid) -> dict[str, Any]:
    """An upload's errors by the line they are on: `{"7": {"path": ["..."]}}`."""
    if isinstance(exc, UploadError):
        return {str(exc.line): {api_settings.NON_FIELD_ERRORS_KEY: [exc.reason]}}
    return {
        str(calls.line_of(index)): {
            api_settings.NON_FIELD_ERRORS_KEY if field == NON_FIELD_ERRORS else field: messages
            for field, messages in fields.items()
        }
        for index, fields in exc.call_errors.items()
    }


class JobDetailView(APIView):
    @extend_schema(responses=JobOutputSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        """One job with its progress."""
        return Response(JobOutputSerializer(job_get_for_user(request.user, job_id)).data)


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
            409: OpenApiResponse(description="the job's status rules the action out"),
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
