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
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import exceptions, serializers, status
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from ratejobs.models import Call, Job, ThrottleEvent
from ratejobs.permissions import may_delete_records
from ratejobs.rest.errors import Conflict
from ratejobs.rest.job_serializers import (
    CallDetailOutputSerializer,
    CallOutputSerializer,
    ConflictSerializer,
    JobCreateInputSerializer,
    JobOutputSerializer,
    JobUploadParamsSerializer,
    StatusFilterSerializer,
    ThrottleEventOutputSerializer,
)
from ratejobs.rest.parsers import JobJSONParser, JsonLinesParser, upload_calls
from ratejobs.rest.serializers import StrictInputSerializer
from ratejobs.rest.throttles import JobCreateThrottle
from ratejobs.rest.views import APIView, GenericAPIView
from ratejobs.selectors.jobs import (
    call_get_for_job,
    call_list_for_job,
    call_response_bodies,
    job_get_by_idempotency_key,
    job_get_for_user,
    job_list_for_user,
    throttle_event_list_for_job,
)
from ratejobs.selectors.results import RESULT_FIELDS, RESULTS_FORMATS, job_results_response
from ratejobs.services.jobs import (
    JobActionRefused,
    JobCloneRefused,
    calls_check,
    job_act,
    job_clone,
    job_submit,
)
from ratejobs.services.retention import JobPurgeRefused, job_purge_request
from ratejobs.uploads import UploadError, job_submit_from_file

IDEMPOTENCY_HEADER = "Idempotency-Key"
# Printable ASCII, as long as the column holding it (also the schema's pattern, hence `$`: the
# key is matched whole with fullmatch).
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"


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


class JobListCreateView(_JobCreateThrottled, GenericAPIView):
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


class JobCallListView(GenericAPIView):
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
    @extend_schema(responses=CallDetailOutputSerializer)
    def get(self, request: Request, job_id: int, index: int) -> Response:
        """One call of the job by its index, with its whole stored response body and each of its
        attempts (`attempt_history`)."""
        call = call_get_for_job(job_get_for_user(request.user, job_id), index)
        return Response(CallDetailOutputSerializer(call).data)


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


class JobThrottleEventListView(GenericAPIView):
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


class JobCloneInputSerializer(StrictInputSerializer):
    calls = serializers.ChoiceField(
        choices=[("all", "all"), ("failed", "failed")],
        help_text="all: every call of the job; failed: only its calls that failed (a finished "
        "job's; cancelled calls are not copied)",
    )
    # \S: a name of spaces only is blank once trimmed (as JobCreateInputSerializer's)
    name = serializers.RegexField(
        r"\S",
        max_length=Job._meta.get_field("name").max_length,
        required=False,
        help_text="the new job's name; default: the job's, with \" (again)\"",
    )


class JobCloneView(_JobCreateThrottled, APIView):
    @extend_schema(
        request=JobCloneInputSerializer,
        parameters=[_RETRY_AFTER],
        responses={
            201: JobOutputSerializer,
            400: OpenApiResponse(
                description="field errors; no call to copy (`calls`); a call no longer valid "
                "for the API (by index under `calls`); a limit of yours reached"
            ),
            403: OpenApiResponse(description="the job's API no longer takes jobs from you"),
            404: OpenApiResponse(description="no such job, or not one you may see"),
            409: OpenApiResponse(
                ConflictSerializer, "only the failed calls of a job not finished yet"
            ),
            429: _THROTTLED,
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        """Run a job again: a new queued job, yours, on the same API with the same priority,
        credential key and callback (your own job's), and copies of the calls' requests (never
        their responses): `"calls": "all"`, in any status, or `"failed"`, the calls that
        failed, once the job is completed or cancelled (409 before). A not_before or deadline
        is kept while still ahead. The same checks and limits as `POST /api/jobs/`."""
        job = job_get_for_user(request.user, job_id)
        serializer = JobCloneInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        fields = serializer.validated_data
        try:
            clone = job_clone(
                job=job,
                owner=request.user,
                only_failed=fields["calls"] == "failed",
                name=fields.get("name"),
            )
        except JobCloneRefused as exc:
            raise _conflict(exc.job, str(exc)) from exc
        return Response(JobOutputSerializer(clone).data, status=status.HTTP_201_CREATED)
