"""The serializers of the jobs endpoints (ratejobs.rest.jobs): what a job, a call and a
throttle event look like in a response, and what a new job (JSON or an upload's parameters)
may carry. Their class names are the schema's component names."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ratejobs.execution.targets import ALLOWED_METHODS
from ratejobs.limiter.config import MAX_COST
from ratejobs.models import MAX_PRIORITY, Api, Call, CallbackStatus, Job, ThrottleEvent
from ratejobs.rest.parsers import JsonCalls
from ratejobs.rest.serializers import NameField, StrictInputSerializer
from ratejobs.selectors.jobs import OUTCOME_LABELS, job_outcome, response_body_output
from ratejobs.services.credentials import CREDENTIAL_KEY_SHAPE, KEY_MAX_LENGTH, KEY_MESSAGE

# An API's name, a slug (Django's own pattern, with the schema's `$`: matched with fullmatch).
API_NAME_SHAPE = "^[-a-zA-Z0-9_]+$"
# Anything but control characters, backslashes and a fragment, what every call's path the
# service takes looks like (it checks more: no other host, no climbing out of the base path).
CALL_PATH_SHAPE = r"^[^\x00-\x1f\x7f\\#]+$"


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


# A time whose offset's "+" a query string turned into a space.
_PLUS_READ_AS_SPACE = re.compile(r"T\d{2}:\d{2}(:\d{2}(\.\d+)?)? \d{2}(:?\d{2})?$")


class ZonedDateTimeField(serializers.DateTimeField):
    """An ISO 8601 time that says its zone (Z or an offset). A time without one is refused, not
    read as UTC (or as the server's zone): 08:00 meant in Berlin would go out an hour late, and
    nothing would tell the submitter."""

    default_error_messages = {
        "naive": "This time has no time zone: add Z for UTC or an offset such as +02:00 "
        "(2026-12-01T08:00:00Z, 2026-12-01T08:00:00+02:00).",
        "plus_as_space": "The offset's + arrived as a space: in a query string write it as %2B "
        "(2026-12-01T08:00:00%2B02:00), or give the time in UTC with Z.",
    }

    def to_internal_value(self, value: Any) -> datetime:
        # "…T08:00:00+02:00" unencoded in a query string arrives as "…T08:00:00 02:00"
        if isinstance(value, str) and _PLUS_READ_AS_SPACE.search(value):
            self.fail("plus_as_space")
        return super().to_internal_value(value)

    def enforce_timezone(self, value: datetime) -> datetime:
        if timezone.is_naive(value):
            self.fail("naive")
        return super().enforce_timezone(value)


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
    not_before = ZonedDateTimeField(
        required=False,
        help_text="no call is sent before this time (ISO 8601 with Z or an offset; a time "
        "without a zone is a 400)",
    )
    deadline = ZonedDateTimeField(
        required=False,
        help_text="calls not started by this time are cancelled, with that reason; in the "
        "future, and after not_before (ISO 8601 with Z or an offset)",
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


class CallAttemptOutputSerializer(serializers.Serializer):
    """One request of a call: what it got back and what the call did next. Of the response,
    only the headers the limiter reads (Retry-After, rate-limit fields); never a body."""

    number = serializers.IntegerField(
        min_value=1, help_text="1 for the first request, throttled ones counted"
    )
    outcome = serializers.CharField(
        help_text="succeeded, failed, cancelled; retry or throttled: the call was sent again"
    )
    started = serializers.DateTimeField()
    finished = serializers.DateTimeField()
    duration = serializers.FloatField(allow_null=True, min_value=0, help_text="seconds")
    status_code = serializers.IntegerField(allow_null=True, min_value=100, max_value=999)
    error = serializers.CharField()
    throttled = serializers.BooleanField(help_text="the API throttled this request")
    retry_after = serializers.CharField(help_text="the response's Retry-After, as sent")
    retry_in = serializers.FloatField(
        allow_null=True, min_value=0, help_text="seconds the call waited before its next try"
    )
    throttle_headers = serializers.DictField(
        child=serializers.CharField(), help_text="the response's rate-limit headers"
    )


class CallDetailOutputSerializer(CallOutputSerializer):
    """One call, with each of its attempts (a list of calls shows only the counts)."""

    # "attempts" is the count, in lists and here alike: the list goes beside it
    attempt_history = CallAttemptOutputSerializer(
        source="attempt_records",
        many=True,
        help_text="its requests, oldest first, when it took more than one; a call answered at "
        "its first try has none (its own fields are that try)",
    )


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
