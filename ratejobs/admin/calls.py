"""Calls and throttle events in the admin: read-only records of what was sent and received."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import Count, F, Q, QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from ratejobs.admin.access import ReadOnlyStaffAccess, sees_every_job
from ratejobs.admin.cells import clipped, clock_column
from ratejobs.admin.lookups import ShownFiltersOnly
from ratejobs.admin.titles import RecordTitles
from ratejobs.models import Call, CallAttempt, ThrottleEvent
from ratejobs.selectors.jobs import (
    CALL_LIST_DEFERRED,
    job_is_final,
    job_list_for_user,
    response_body_text,
)
from ratejobs.text import moment_text, rate_text, response_removed_text, seconds_text


def pretty_body(body: bytes | memoryview | None, *, truncated: bool) -> tuple[str, str]:
    """The body as a person reads it: indented JSON when it parses, else the text, else a note
    that it is binary; with the kind shown beside it."""
    text = response_body_text(body, truncated=truncated)
    if text is None:
        return ("binary", "" if body is None else f"{len(bytes(body))} bytes of binary data")
    if not truncated:
        try:
            return ("JSON", json.dumps(json.loads(text), indent=2, ensure_ascii=False))
        except ValueError:
            pass
    return ("text", text)


def retry_after_text(event: ThrottleEvent) -> str:
    """How long the event stopped the workers: a Retry-After, or a block's length."""
    return "—" if event.retry_after is None else seconds_text(event.retry_after)


def rate_change_text(event: ThrottleEvent, *, period: float) -> str:
    """The adaptive rate's cut, per second whatever the API's period (its limiter counts
    requests per period): "20.0/s → 14.0/s"."""
    if event.rate_before is None or event.rate_after is None:
        return "—"
    period = period or 1.0
    return f"{rate_text(event.rate_before / period)} → {rate_text(event.rate_after / period)}"


# A call's page shows its newest attempts up to this many: a call throttled a thousand times
# (max_throttled_retries) would otherwise make a page of a thousand rows.
ATTEMPTS_SHOWN = 200


@dataclass(frozen=True)
class CallAttemptRow:
    """One row of a call's Attempts table, as a person reads it."""

    number: int
    started: str
    took: str
    status_code: str
    outcome: str
    throttled: bool
    retry_after: str
    retry_in: str
    headers: list[tuple[str, str]]
    error: str

    @classmethod
    def of(cls, attempt: CallAttempt) -> CallAttemptRow:
        # to the millisecond: a call's attempts can be that close together
        started = timezone.localtime(attempt.started).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        return cls(
            number=attempt.number,
            started=started,
            took=seconds_text(attempt.duration),
            status_code=str(attempt.status_code) if attempt.status_code else "—",
            outcome=attempt.outcome,
            throttled=attempt.throttled,
            retry_after=attempt.retry_after or "—",
            retry_in=seconds_text(attempt.retry_in),
            headers=sorted(attempt.throttle_headers.items()),
            error=attempt.error,
        )


def call_attempts_html(call: Call) -> str:
    """The call's Attempts table: its newest ATTEMPTS_SHOWN attempts, oldest first."""
    attempts = CallAttempt.objects.filter(call=call)
    newest = list(attempts.order_by("-finished", "-pk")[:ATTEMPTS_SHOWN])
    earlier = attempts.count() - len(newest) if len(newest) == ATTEMPTS_SHOWN else 0
    context = {
        "rows": [CallAttemptRow.of(attempt) for attempt in reversed(newest)],
        "earlier": earlier,
        "removed": call.response_removed_at is not None,
        # a call answered at its first try keeps no attempt row (services.calls._attempt_kept)
        "tries": call.attempts + call.throttled_count,
    }
    return render_to_string("admin/ratejobs/call/_attempts.html", context)


class CallOutcomeFilter(admin.SimpleListFilter):
    """How calls ended, and those that met the API's limits on the way (a status alone does
    not say a succeeded call was throttled or retried first)."""

    title = "outcome"
    parameter_name = "outcome"
    OUTCOMES = {
        "succeeded": ("succeeded", Q(status=Call.Status.SUCCEEDED)),
        "failed": ("failed", Q(status=Call.Status.FAILED)),
        "cancelled": ("cancelled", Q(status=Call.Status.CANCELLED)),
        "unfinished": (
            "not finished yet",
            Q(status__in=(Call.Status.PENDING, Call.Status.RUNNING)),
        ),
        "throttled": ("throttled (429) at least once", Q(throttled_count__gt=0)),
        "retried": ("sent more than once", Q(attempts__gt=1)),
    }

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return [(key, label) for key, (label, _) in self.OUTCOMES.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Call]) -> QuerySet[Call]:
        chosen = self.OUTCOMES.get(self.value() or "")
        return queryset if chosen is None else queryset.filter(chosen[1])


# The jobs the job filter offers besides the chosen one: the newest, since a list of every
# job would be as long as the jobs table (a job's own page links to its calls, and the
# filter's box takes any job's number).
RECENT_JOBS = 8
# Without a chosen job, the status codes offered are those of the newest calls: a DISTINCT over
# every call ever made reads the whole table on each page.
STATUS_CODE_SAMPLE = 5000


def _number(value: str | None) -> int | None:
    """A positive database id from the query string, or None for anything else."""
    value = value or ""
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else None


class JobFilter(admin.SimpleListFilter):
    """One job's calls or events (?job__id__exact=<id>, as Django names a job lookup), offered
    among the newest jobs and, for any other, by number in the filter's box."""

    title = "job"
    parameter_name = "job__id__exact"
    # The name the filter had before, still read: links to it went out in logs, the overview
    # and submit_job's output (ShownFiltersOnly allows it too).
    older_parameters = ("job",)
    template = "admin/ratejobs/call/job_filter.html"

    def __init__(
        self, request: HttpRequest, params: dict, model: Any, model_admin: admin.ModelAdmin
    ) -> None:
        for older in self.older_parameters:
            if older in params:
                params.setdefault(self.parameter_name, params.pop(older))
        super().__init__(request, params, model, model_admin)
        # the box's form sends the list's other filters and its sorting along with the job
        self.kept_parameters = [
            (key, value)
            for key, values in request.GET.lists()
            if key not in (*self.expected_parameters(), "p")
            for value in values
        ]

    def expected_parameters(self) -> list[str]:
        return [self.parameter_name, *self.older_parameters]

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:
        # SimpleListFilter's own, but dropping an older ?job= too: else "All" kept it
        remove = self.expected_parameters()
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=remove),
            "display": "All",
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == str(lookup),
                "query_string": changelist.get_query_string({self.parameter_name: lookup}, remove),
                "display": title,
            }

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        # the lists are scoped to the jobs the user sees, and so are the jobs offered here
        visible = job_list_for_user(request.user)
        jobs = list(visible.values_list("pk", "name")[:RECENT_JOBS])
        chosen = self.job_id()
        if chosen is not None and all(pk != chosen for pk, _ in jobs):
            jobs[:0] = visible.filter(pk=chosen).values_list("pk", "name")[:1] or [(chosen, "")]
        return [(str(pk), f"#{pk} {name}".rstrip()) for pk, name in jobs]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() is None:
            return queryset
        job_id = self.job_id()
        return queryset.none() if job_id is None else queryset.filter(job_id=job_id)

    def job_id(self) -> int | None:
        return _number(self.value())


def chosen_job_id(request: HttpRequest) -> int | None:
    """The job a list is filtered to, under either of JobFilter's names."""
    names = (JobFilter.parameter_name, *JobFilter.older_parameters)
    return next((_number(request.GET[name]) for name in names if name in request.GET), None)


class StatusCodeFilter(admin.SimpleListFilter):
    """Calls by the HTTP status of their last response, offering the codes the chosen job's
    calls got (or, with no job chosen, the newest calls'), each with its count in the job."""

    title = "status code"
    parameter_name = "status_code__exact"
    NONE = "none"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        job_id = chosen_job_id(request)
        calls = model_admin.get_queryset(request)
        if job_id is not None:
            counts = status_code_counts(calls.filter(job_id=job_id))
            choices = [(str(code), f"{code} ({count})") for code, count in counts]
        else:
            newest = calls.order_by("-pk").values_list("status_code", flat=True)
            codes = sorted({code for code in newest[:STATUS_CODE_SAMPLE] if code is not None})
            choices = [(str(code), str(code)) for code in codes]
        chosen = self.value()
        if chosen not in (None, self.NONE) and all(value != chosen for value, _ in choices):
            choices.append((chosen, chosen))  # still shown as the one chosen
        return [*choices, (self.NONE, "no response")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Call]) -> QuerySet[Call]:
        value = self.value()
        if value is None:
            return queryset
        if value == self.NONE:
            return queryset.filter(status_code__isnull=True)
        code = _number(value)
        return queryset.none() if code is None else queryset.filter(status_code=code)


def status_code_counts(calls: QuerySet[Call]) -> list[tuple[int, int]]:
    """(status code, number of calls) among `calls` that got a response, lowest code first."""
    rows = (
        calls.filter(status_code__isnull=False)
        .order_by("status_code")
        .values_list("status_code")
        .annotate(count=Count("pk"))
    )
    return [(code, count) for code, count in rows]


def calls_url(job_id: int, **filters: Any) -> str:
    """The Calls list filtered to one job, and to `filters` (status__exact=..., ...)."""
    query = urlencode({JobFilter.parameter_name: job_id, **filters})
    return f"{reverse('admin:ratejobs_call_changelist')}?{query}"


def job_calls_links_html(job: Any) -> str:
    """The job page's links to its calls: all, failed, and each status code the job's calls
    got, with their counts ("200 (480) · 429 (3) · 500 (2)"); "so far" while the job runs (the
    page's progress data sends them again once, when it is final)."""
    codes = status_code_counts(Call.objects.filter(job=job))
    context = {
        "job": job,
        "final": job_is_final(job),
        "all_url": calls_url(job.pk),
        "failed_url": calls_url(job.pk, status__exact=Call.Status.FAILED),
        "codes": [
            (code, count, calls_url(job.pk, status_code__exact=code)) for code, count in codes
        ],
        "events_url": events_url(job.pk),
    }
    return render_to_string("admin/ratejobs/job/_calls_links.html", context)


def events_url(job_id: int) -> str:
    query = urlencode({JobFilter.parameter_name: job_id})
    return f"{reverse('admin:ratejobs_throttleevent_changelist')}?{query}"


def job_link(job: Any) -> str:
    """The job's name, linked to its page."""
    if job is None:
        return "—"
    url = reverse("admin:ratejobs_job_change", args=[job.pk])
    return format_html('<a href="{}">{}</a>', url, clipped(job.name))


@admin.register(Call)
class CallAdmin(RecordTitles, ShownFiltersOnly, ReadOnlyStaffAccess, admin.ModelAdmin):
    list_display = (
        "call_column",
        "request_column",
        "status",
        "status_code_column",
        "attempts_column",
        "throttled_column",
        "duration_column",
        "finished_clock",
    )
    list_display_links = ("call_column",)
    list_filter = (JobFilter, "job__api", "status", StatusCodeFilter, CallOutcomeFilter, "method")
    search_fields = ("path",)
    list_select_related = ("job",)
    list_per_page = 100
    show_full_result_count = False  # a count of millions of rows on every page is not worth it
    ordering = ("job", "index")
    fieldsets = (
        (None, {"fields": ("job", "index", "status", "error")}),
        (
            "Request",
            {"fields": ("method", "path", "query", "headers", "json", "body", "sent_with_key")},
        ),
        (
            "Response",
            {
                "fields": (
                    "status_code",
                    "duration_text",
                    "cost",
                    "cost_used",
                    "response_headers",
                    "response_view",
                )
            },
        ),
        (
            "Attempts",
            {
                "fields": (
                    "requests_sent",
                    "next_attempt_clock",
                    "created_clock",
                    "started_clock",
                    "finished_clock",
                    "attempt_table",
                )
            },
        ),
    )
    readonly_fields = tuple(field for _, options in fieldsets for field in options["fields"])

    class Media:
        css = {"all": ("ratejobs/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Call]:
        calls = super().get_queryset(request)
        if not sees_every_job(request):
            calls = calls.filter(job__owner=request.user)
        if request.resolver_match and request.resolver_match.url_name.endswith("changelist"):
            calls = calls.defer(*CALL_LIST_DEFERRED, "response_body")
        return calls

    @admin.display(description="call", ordering="index")
    def call_column(self, call: Call) -> str:
        """The call as the job page names it: the job's name and the call's index in it."""
        return format_html("{} #{}", clipped(call.job.name), call.index)

    @admin.display(description="request", ordering="path")
    def request_column(self, call: Call) -> str:
        return format_html("{} {}", call.method, clipped(call.path))

    @admin.display(description="tries", ordering="attempts")
    def attempts_column(self, call: Call) -> int:
        return call.attempts

    @admin.display(description="HTTP", ordering="status_code")
    def status_code_column(self, call: Call) -> str:
        return str(call.status_code) if call.status_code else "—"

    @admin.display(description="429s", ordering="throttled_count")
    def throttled_column(self, call: Call) -> int:
        return call.throttled_count

    @admin.display(description="took", ordering="duration")
    def duration_column(self, call: Call) -> str:
        return seconds_text(call.duration)

    created_clock = clock_column("created")
    started_clock = clock_column("started")
    finished_clock = clock_column("finished")
    next_attempt_clock = clock_column("next_attempt_at", "next attempt at")

    @admin.display(description="requests sent")
    def requests_sent(self, call: Call) -> str:
        """Every request that went out, told apart: the model's `attempts` counts only those
        that used one of the API's attempts, and a 429 uses none (it read "Attempts: 1" for a
        call sent six times)."""
        used = f"{call.attempts} of {call.job.api.max_attempts} attempts used"
        if not call.throttled_count:
            return f"{call.attempts} ({used})"
        sent = call.attempts + call.throttled_count
        return f"{sent} ({used}; {call.throttled_count} answered 429, which use none)"

    @admin.display(description="attempts")
    def attempt_table(self, call: Call) -> str:
        return call_attempts_html(call)

    @admin.display(description="duration of the last request")
    def duration_text(self, call: Call) -> str:
        return seconds_text(call.duration)

    @admin.display(description="credential key")
    def sent_with_key(self, call: Call) -> str:
        """The customer's credential the call is sent with (its own key, else its job's)."""
        key = call.credential_key or call.job.credential_key
        return key or "none: the API's own credential"

    @admin.display(description="response body")
    def response_view(self, call: Call) -> str:
        removed = response_removed_text(call)
        if call.response_body is None and removed is not None:
            return format_html(
                '<div class="rj-body-meta">body and headers {}, on {}</div>',
                removed,
                moment_text(call.response_removed_at),
            )
        if call.response_body is None:
            return "—"
        kind, text = pretty_body(call.response_body, truncated=call.response_truncated)
        size = len(bytes(call.response_body))
        marker = (
            format_html(' <strong class="rj-blocked">truncated at {} bytes</strong>', size)
            if call.response_truncated
            else ""
        )
        return format_html(
            '<div class="rj-body-meta">{}, {} bytes{}</div><pre class="rj-body">{}</pre>',
            kind,
            size,
            marker,
            text,
        )


@admin.register(ThrottleEvent)
class ThrottleEventAdmin(RecordTitles, ShownFiltersOnly, ReadOnlyStaffAccess, admin.ModelAdmin):
    list_display = (
        "created_clock",
        "kind",
        "api_column",
        "job_column",
        "call_link",
        "status_code_column",
        "retry_after_column",
        "rate_change_column",
    )
    list_filter = (JobFilter, "api", "kind", "created")
    date_hierarchy = "created"
    list_select_related = ("api", "job")
    list_per_page = 100
    show_full_result_count = False
    search_fields = ("api__name", "job__name")
    fields = (
        "created_clock", "kind", "api", "job", "call", "status_code", "retry_after_column",
        "rate_change_column",
    )  # fmt: skip
    readonly_fields = fields

    class Media:
        css = {"all": ("ratejobs/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[ThrottleEvent]:
        events = super().get_queryset(request)
        if not sees_every_job(request):
            events = events.filter(job__owner=request.user)
        # the call's index only: a call row carries its response body (up to 1 MiB)
        return events.annotate(call_index=F("call__index"))

    created_clock = clock_column("created", "time")

    @admin.display(description="API", ordering="api__name")
    def api_column(self, event: ThrottleEvent) -> str:
        return clipped(event.api.name)

    @admin.display(description="job", ordering="job__name")
    def job_column(self, event: ThrottleEvent) -> str:
        return job_link(event.job)

    @admin.display(description="call", ordering="call__index")
    def call_link(self, event: ThrottleEvent) -> str:
        """The call by its index in the job, as the job page numbers it."""
        if event.call_id is None:
            return "—"
        url = reverse("admin:ratejobs_call_change", args=[event.call_id])
        return format_html('<a href="{}">#{}</a>', url, event.call_index)

    @admin.display(description="HTTP", ordering="status_code")
    def status_code_column(self, event: ThrottleEvent) -> str:
        return str(event.status_code) if event.status_code else "—"

    @admin.display(description="Retry-After / block", ordering="retry_after")
    def retry_after_column(self, event: ThrottleEvent) -> str:
        return retry_after_text(event)

    @admin.display(description="rate before → after", ordering="rate_after")
    def rate_change_column(self, event: ThrottleEvent) -> str:
        return rate_change_text(event, period=event.api.period)
