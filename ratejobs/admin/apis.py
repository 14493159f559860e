"""APIs in the admin: limits edited live, the limiter's state read from Redis, secrets masked."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from ratejobs.admin.access import ManagerAccess, sees_every_job
from ratejobs.admin.forms import ApiAdminForm
from ratejobs.execution.request import MASK
from ratejobs.limiter import LimiterError, LimiterState
from ratejobs.models import Api, ThrottleEvent
from ratejobs.selectors.apis import (
    LimiterReading,
    api_key_buckets,
    api_limiter_readings,
    credential_list,
    window_text,
)
from ratejobs.services.apis import (
    EDITABLE_FIELDS,
    api_block,
    api_create,
    api_limiter_reset,
    api_update,
)
from ratejobs.services.credentials import credential_delete, credentials_add

# Longest block an operator may set by hand: a day, enough for any published quota reset.
MAX_MANUAL_BLOCK_SECONDS = 86_400


class ApiChangeList(ChangeList):
    """Reads the limiter state of the page's APIs from Redis once per page."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        readings = api_limiter_readings(self.result_list)
        for api in self.result_list:
            api.limiter_reading = readings[api.pk]


def credential_text(api: Api) -> str:
    if api.credential_encrypted:
        return "stored (encrypted)"
    if api.credential_env:
        return f"from the workers' environment variable {api.credential_env}"
    return "none"


def learned_limit_text(state: LimiterState) -> str:
    """The API's real limit as the adaptive rate learned it from throttles."""
    if not state.adaptive:
        return "- (not adaptive)"
    if state.learned_rate is None:
        return "not measured yet (no throttle so far)"
    return f"{state.learned_rate:.3g} per {state.period:g} s (held just under it)"


def limiter_state_table(reading: LimiterReading) -> str:
    """The live limiter state as the operator wants it: pace now against the ceiling, how
    long everyone is blocked, what is in flight."""
    if reading.state is None:
        return format_html('<p class="rj-blocked">{}</p>', reading.error)
    state = reading.state
    blocked = (
        format_html('<span class="rj-blocked">blocked for {} s</span>', f"{state.blocked_for:.1f}")
        if state.blocked_for
        else "not blocked"
    )
    rows = [
        ("current rate", f"{state.current_rate:.3g} per {state.period:g} s"),
        ("ceiling", f"{state.rate:.3g} per {state.period:g} s (burst {state.burst})"),
        *(("limit", window_text(window)) for window in state.windows),
        ("adaptive", f"yes, floor {state.min_rate:.3g}" if state.adaptive else "no"),
        ("learned limit", learned_limit_text(state)),
        ("blocked", blocked),
        ("next free slot in", f"{state.next_free_in:.3f} s"),
        (
            "in flight",
            f"{state.in_flight} of {state.max_concurrency}"
            if state.max_concurrency
            else f"{state.in_flight} (no cap)",
        ),
        ("generation", str(state.generation)),
    ]
    return format_html(
        '<table class="rj-state">{}</table>',
        format_html(
            "".join("<tr><th>{}</th><td>{}</td></tr>" for _ in rows),
            *[cell for row in rows for cell in row],
        ),
    )


# Credential keys listed on an API's page; a search finds the others.
CREDENTIALS_SHOWN = 50


def credentials_context(request: HttpRequest, api: Api) -> dict[str, Any]:
    """The page's credentials per customer: how many, the first CREDENTIALS_SHOWN keys (of a
    search, ?credential_search=), and the key buckets live in Redis. Never a secret."""
    search = request.GET.get("credential_search", "")[:100]
    everyone = credential_list(api=api)
    shown = credential_list(api=api, search=search)
    try:
        buckets, buckets_error = api_key_buckets(api), None
    except LimiterError as exc:
        buckets, buckets_error = None, f"key buckets unavailable: {type(exc).__name__}"
    return {
        "credential_count": everyone.count(),
        "credential_search": search,
        "credentials_shown": list(shown[:CREDENTIALS_SHOWN]),
        "credentials_matching": shown.count() if search else None,
        "key_buckets": buckets,
        "key_buckets_error": buckets_error,
        "credential_save_url": reverse("admin:ratejobs_api_credential_save", args=[api.pk]),
        "credential_delete_url": reverse("admin:ratejobs_api_credential_delete", args=[api.pk]),
    }


@admin.register(Api)
class ApiAdmin(ManagerAccess, admin.ModelAdmin):
    form = ApiAdminForm
    change_form_template = "admin/ratejobs/api/change_form.html"
    list_display = (
        "name",
        "base_url",
        "limit_column",
        "burst",
        "max_concurrency",
        "adaptive",
        "current_rate_column",
        "blocked_column",
        "in_flight_column",
        "credential_column",
    )
    search_fields = ("name", "base_url")
    filter_horizontal = ("submitter_groups",)
    list_filter = ("adaptive",)
    fieldsets = (
        (None, {"fields": ("name", "base_url")}),
        (
            "Limits (take effect at the next grant)",
            {
                "fields": (
                    ("rate", "period", "burst"),
                    "max_concurrency",
                    ("adaptive", "min_rate"),
                    "limits",
                )
            },
        ),
        ("Calls", {"fields": ("max_attempts", "max_throttled_retries", "timeout")}),
        ("Who may submit jobs to it", {"fields": ("submitter_groups",)}),
        (
            "Headers and credentials",
            {
                "fields": (
                    "default_headers",
                    "auth_header",
                    "idempotency_header",
                    ("cost_header", "cost_json_field"),
                    "credential_status",
                    "credential",
                    "clear_credential",
                    "credential_env",
                    "credential_to_new_origin",
                )
            },
        ),
        ("Record", {"fields": ("created", "updated")}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Api | None = None) -> Any:
        if self.has_change_permission(request, obj):
            return self.fieldsets
        # Read-only for those who may not manage APIs: a default header's value may be a key,
        # and the credential's inputs have nothing to show.
        shown = {"default_headers": "default_header_names", "credential": None,
                 "clear_credential": None, "credential_to_new_origin": None}  # fmt: skip
        return tuple(
            (title, {"fields": tuple(
                shown.get(name, name) for name in options["fields"] if shown.get(name, name)
            )})
            for title, options in self.fieldsets
        )  # fmt: skip

    @admin.display(description="default headers")
    def default_header_names(self, api: Api) -> str:
        return ", ".join(f"{name}: {MASK}" for name in api.default_headers) or "none"

    def get_readonly_fields(self, request: HttpRequest, obj: Api | None = None) -> tuple:
        fixed = ("credential_status", "default_header_names", "created", "updated")
        return ("name", *fixed) if obj is not None else fixed

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ApiChangeList

    @admin.display(description="stored credential")
    def credential_status(self, api: Api) -> str:
        return credential_text(api)

    @admin.display(description="credential")
    def credential_column(self, api: Api) -> str:
        return credential_text(api)

    @admin.display(description="limit", ordering="rate")
    def limit_column(self, api: Api) -> str:
        more = f" + {len(api.limits)} more" if api.limits else ""
        return f"{api.rate:g} / {api.period:g} s{more}"

    @admin.display(description="rate now")
    def current_rate_column(self, api: Api) -> str:
        state = api.limiter_reading.state
        return "?" if state is None else f"{state.current_rate:.3g}"

    @admin.display(description="blocked")
    def blocked_column(self, api: Api) -> str:
        state = api.limiter_reading.state
        if state is None:
            return "?"
        return f"{state.blocked_for:.1f} s" if state.blocked_for else "—"

    @admin.display(description="in flight")
    def in_flight_column(self, api: Api) -> str:
        state = api.limiter_reading.state
        return "?" if state is None else str(state.in_flight)

    def save_model(self, request: HttpRequest, obj: Api, form: ApiAdminForm, change: bool) -> None:
        """Through the services, so a new limit reaches the shared limiter at once."""
        credential = form.cleaned_data.get("credential") or None
        if form.cleaned_data.get("clear_credential"):
            credential = ""
        if change:
            fields = {name: getattr(obj, name) for name in EDITABLE_FIELDS}
            given = form.credential_given()
            api_update(api=obj, credential=credential, credential_given=given, **fields)
        else:
            fields = {name: getattr(obj, name) for name in ("name", *EDITABLE_FIELDS)}
            obj.pk = api_create(credential=credential, **fields).pk

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:api_id>/reset/",
                wrap(require_POST(self.reset_view)),
                name="ratejobs_api_reset",
            ),
            path(
                "<int:api_id>/block/",
                wrap(require_POST(self.block_view)),
                name="ratejobs_api_block",
            ),
            path(
                "<int:api_id>/credentials/",
                wrap(require_POST(self.credential_save_view)),
                name="ratejobs_api_credential_save",
            ),
            path(
                "<int:api_id>/credentials/delete/",
                wrap(require_POST(self.credential_delete_view)),
                name="ratejobs_api_credential_delete",
            ),
            *super().get_urls(),
        ]

    def _api_for_action(self, request: HttpRequest, api_id: int) -> Api:
        api = get_object_or_404(Api, pk=api_id)
        if not self.has_change_permission(request, api):
            raise PermissionDenied
        return api

    def _back(self, api: Api) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:ratejobs_api_change", args=[api.pk]))

    def reset_view(self, request: HttpRequest, api_id: int) -> HttpResponse:
        api = self._api_for_action(request, api_id)
        try:
            keys = api_limiter_reset(api=api)
        except LimiterError as exc:
            self.message_user(request, f"Could not reset the limiter: {exc}", messages.ERROR)
        else:
            also = f" (and the buckets of {keys} credential keys)" if keys else ""
            self.message_user(request, f"Limiter reset{also}: full rate, no block, no leases.")
        return self._back(api)

    def credential_save_view(self, request: HttpRequest, api_id: int) -> HttpResponse:
        """Add a credential key, or give an existing one a new secret."""
        api = self._api_for_action(request, api_id)
        key, secret = request.POST.get("key", ""), request.POST.get("secret", "")
        try:
            credentials_add(api=api, items=[(key, secret)], replace=True)
        except ValidationError as exc:
            self.message_user(request, "; ".join(exc.messages), messages.ERROR)
        else:
            self.message_user(request, f"Credential {key!r} stored (encrypted).")
        return self._back(api)

    def credential_delete_view(self, request: HttpRequest, api_id: int) -> HttpResponse:
        api = self._api_for_action(request, api_id)
        key = request.POST.get("key", "")
        if credential_delete(api=api, key=key):
            self.message_user(request, f"Credential {key!r} deleted.")
        else:
            self.message_user(request, f"No credential {key!r}.", messages.ERROR)
        return self._back(api)

    def block_view(self, request: HttpRequest, api_id: int) -> HttpResponse:
        api = self._api_for_action(request, api_id)
        try:
            seconds = float(request.POST.get("seconds", ""))
            if not 0 < seconds <= MAX_MANUAL_BLOCK_SECONDS:
                raise ValueError
        except ValueError:
            self.message_user(
                request,
                f"Block for how long? Give a number of seconds from 0 to "
                f"{MAX_MANUAL_BLOCK_SECONDS}.",
                messages.ERROR,
            )
            return self._back(api)
        try:
            api_block(api=api, seconds=seconds)
        except (LimiterError, ValidationError) as exc:
            self.message_user(request, f"Could not block: {exc}", messages.ERROR)
        else:
            self.message_user(request, f"Every worker waits {seconds:g} s before calling {api}.")
        return self._back(api)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        api = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if api is not None:
            since = timezone.now() - timedelta(hours=1)
            recent = ThrottleEvent.objects.filter(api=api, created__gte=since)
            recent_events = list(recent.select_related("job").order_by("-created", "-pk")[:10])
            context.update(
                can_manage=self.has_change_permission(request, api),
                visible_job_ids={
                    event.job_id
                    for event in recent_events
                    if event.job is not None
                    and (sees_every_job(request) or event.job.owner_id == request.user.pk)
                },
                limiter_state=limiter_state_table(api_limiter_readings([api])[api.pk]),
                recent_throttles=recent.filter(kind=ThrottleEvent.Kind.THROTTLED).count(),
                recent_events=recent_events,
                reset_url=reverse("admin:ratejobs_api_reset", args=[api.pk]),
                **credentials_context(request, api),
                block_url=reverse("admin:ratejobs_api_block", args=[api.pk]),
                max_block=MAX_MANUAL_BLOCK_SECONDS,
            )
        return super().change_view(request, object_id, form_url, extra_context=context)
