"""REST endpoints for jobs: submit a batch of calls, follow its progress, its calls and its
throttle events, and pause, resume, cancel or retry it. Users see only their own jobs (404 for
anyone else's); staff see every job."""

from __future__ import annotations

import base64
import re
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ratejobs.api.errors import Conflict
from ratejobs.api.serializers import StrictInputSerializer
from ratejobs.execution.urls import ALLOWED_METHODS
from ratejobs.models import Api, Call, Job, ThrottleEvent
from ratejobs.selectors.jobs import (
    call_list_for_job,
    job_get_by_idempotency_key,
    job_get_for_user,
    job_list_for_user,
    response_body_text,
    throttle_event_list_for_job,
)
from ratejobs.services.jobs import JobActionRefused, job_act, job_create

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

    def to_internal_value(self, data: Any) -> list[Any]:
        if not isinstance(data, list):
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
        help_text="UTF-8 text, or base64 when response_body_base64 is true"
    )
    response_body_base64 = serializers.SerializerMethodField()
    started = serializers.DateTimeField(allow_null=True)
    finished = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_response_body(self, call: Call) -> str | None:
        text = response_body_text(call.response_body, truncated=call.response_truncated)
        if text is None and call.response_body is not None:
            return base64.b64encode(bytes(call.response_body)).decode("ascii")
        return text

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_response_body_base64(self, call: Call) -> bool:
        return (
            call.response_body is not None
            and response_body_text(call.response_body, truncated=call.response_truncated) is None
        )


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


# -- views ---------------------------------------------------------------------------------


class JobListCreateView(generics.GenericAPIView):
    queryset = Job.objects.none()  # for the schema; reads go through selectors

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
        """Your jobs (every job for staff), newest first; `?status=` filters (400 if unknown)."""
        jobs = job_list_for_user(request.user, status=_status_filter(request, Job.Status.choices))
        page = self.paginate_queryset(jobs)
        return self.get_paginated_response(JobOutputSerializer(page, many=True).data)

    @extend_schema(
        request=JobCreateInputSerializer,
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="a retry with the same key returns the first job (200) instead "
                "of making another",
            )
        ],
        responses={
            201: JobOutputSerializer,
            200: OpenApiResponse(JobOutputSerializer, "replay of an Idempotency-Key"),
            400: OpenApiResponse(description="field errors; calls by index under `calls`"),
            413: OpenApiResponse(description="request body over RATEJOBS_MAX_REQUEST_BYTES"),
        },
    )
    def post(self, request: Request) -> Response:
        """Submit a job: 201 with the job, every call validated and stored, or a 400 naming
        the bad fields (a bad call by its index under `calls`) and nothing stored.

        With an `Idempotency-Key` header, a retry with a key you already used returns that
        first job with 200 (whatever the new body says) and stores nothing."""
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is not None and not _IDEMPOTENCY_KEY.match(key):
            raise serializers.ValidationError(
                {IDEMPOTENCY_HEADER: ["1 to 200 printable ASCII characters, no spaces."]}
            )
        data = request.data  # parsing first: an oversize body is a 413 even when replayed
        if key is not None:
            existing = job_get_by_idempotency_key(owner=request.user, key=key)
            if existing is not None:
                return Response(JobOutputSerializer(existing).data, status=status.HTTP_200_OK)
        serializer = JobCreateInputSerializer(data=data)
        serializer.is_valid(raise_exception=True)
        job = job_create(owner=request.user, idempotency_key=key, **serializer.validated_data)
        return Response(JobOutputSerializer(job).data, status=status.HTTP_201_CREATED)


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
        `?page_size=` up to 1000."""
        job = job_get_for_user(request.user, job_id)
        calls = call_list_for_job(job, status=_status_filter(request, Call.Status.choices))
        page = self.paginate_queryset(calls)
        return self.get_paginated_response(CallOutputSerializer(page, many=True).data)


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
