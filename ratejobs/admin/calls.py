"""Calls and throttle events in the admin: read-only records of what was sent and received."""

from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ratejobs.admin.access import ReadOnlyStaffAccess, sees_every_job
from ratejobs.admin.jobs import moment_text
from ratejobs.models import Call, ThrottleEvent
from ratejobs.selectors.jobs import CALL_LIST_DEFERRED, response_body_text, response_removed_text


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


@admin.register(Call)
class CallAdmin(ReadOnlyStaffAccess, admin.ModelAdmin):
    list_display = (
        "index",
        "job",
        "method",
        "path",
        "status",
        "status_code",
        "attempts",
        "throttled_count",
        "duration",
        "finished",
    )
    list_display_links = ("index",)
    list_filter = ("status", "method", "job__api")
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
                    "duration",
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
                    "attempts",
                    "throttled_count",
                    "next_attempt_at",
                    "created",
                    "started",
                    "finished",
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
class ThrottleEventAdmin(ReadOnlyStaffAccess, admin.ModelAdmin):
    list_display = (
        "created",
        "kind",
        "api",
        "job",
        "call_link",
        "status_code",
        "retry_after",
        "rate_before",
        "rate_after",
    )
    list_filter = ("kind", "api", "created")
    date_hierarchy = "created"
    list_select_related = ("api", "job")
    list_per_page = 100
    show_full_result_count = False
    search_fields = ("api__name", "job__name")

    def get_queryset(self, request: HttpRequest) -> QuerySet[ThrottleEvent]:
        events = super().get_queryset(request)
        if not sees_every_job(request):
            events = events.filter(job__owner=request.user)
        return events

    @admin.display(description="call")
    def call_link(self, event: ThrottleEvent) -> str:
        return f"#{event.call_id}" if event.call_id else "—"
