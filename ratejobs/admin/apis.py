"""APIs in the admin: limits edited live, the limiter's state read from Redis, secrets masked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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
from ratejobs.admin.cells import clipped, clock_column
from ratejobs.admin.confirm import confirmation_page, confirmed
from ratejobs.admin.forms import ApiAdminForm
from ratejobs.admin.lookups import ShownFiltersOnly
from ratejobs.admin.window_rows import windows_html
from ratejobs.execution.request import MASK
from ratejobs.limiter import LimiterError, LimiterState
from ratejobs.limiter.core import MICROS
from ratejobs.models import Api, Job, ThrottleEvent
from ratejobs.selectors.apis import (
    LimiterReading,
    api_key_buckets,
    api_limiter_readings,
    credential_list,
)
from ratejobs.selectors.jobs import throttle_event_story
from ratejobs.services.apis import (
    EDITABLE_FIELDS,
    api_block,
    api_create,
    api_limiter_reset,
    api_update,
)
from ratejobs.services.credentials import credential_delete, credentials_add
from ratejobs.text import (
    in_flight_text,
    moment_text,
    rate_text,
    seconds_text,
    throttle_event_text,
    window_text,
)

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


def count_text(count: float) -> str:
    """A limit's count rounded for reading: "300", "13.9", "0.05"."""
    if count == int(count):
        return str(int(count))
    return f"{count:.1f}" if abs(count) >= 10 else f"{count:.2g}"


def per_period_text(count: float, period: float) -> str:
    """A rate given per period: "12.3/s" when the period is a second, else "300 per 60 s
    (5.0/s)", so limits of different periods compare at a glance."""
    if period == 1:  # a configured "20/s" reads as given, a measured 12.34 as "12.3/s"
        return f"{count_text(count)}/s" if count == int(count) else rate_text(count)
    return f"{count_text(count)} per {count_text(period)} s ({rate_text(count / period)})"


def credential_text(api: Api) -> str:
    if api.credential_encrypted:
        return "stored (encrypted)"
    if api.credential_env:
        return f"from the workers' environment variable {api.credential_env}"
    return "none"


# Below this share of the learned limit the rate is not holding under it but was cut (holding
# is at 0.99 of it, lib/adaptive.lua LEARN_HOLD; a little margin for the probe's rounding).
HOLDING_SHARE = 0.985


def rate_story_text(state: LimiterState) -> str:
    """The rate now, what it learned and the ceiling told as one story: "holding 11.9/s, just
    under the 12/s it learned; ceiling 20/s", "probing at 13.3/s, above …", "cut to …"."""
    now = per_period_text(state.current_rate, state.period)
    ceiling = f"ceiling {per_period_text(state.rate, state.period)}"
    if not state.adaptive:
        return f"{now}, the configured ceiling (not adaptive)"
    learned = state.learned_rate
    if learned is None:
        if state.current_rate >= state.rate:
            return f"{now}, at the ceiling; no limit learned yet (no 429 so far)"
        return f"cut to {now} after a 429, climbing back; no limit learned yet; {ceiling}"
    it_learned = f"the {per_period_text(learned, state.period)} it learned"
    if state.current_rate > learned:
        return f"probing at {now}, above {it_learned}; {ceiling}"
    if state.current_rate >= HOLDING_SHARE * learned:
        return f"holding {now}, just under {it_learned}; {ceiling}"
    return f"cut to {now} after a 429, below {it_learned}; {ceiling}"


def blocked_text(state: LimiterState) -> str:
    """How long every worker still waits, and until what time on the clock."""
    if not state.blocked_for:
        return "not blocked"
    until = datetime.fromtimestamp(state.blocked_until_us / MICROS, UTC)
    return f"blocked for {seconds_text(state.blocked_for)} more, until {moment_text(until)}"


def limiter_state_table(reading: LimiterReading) -> str:
    """The live limiter state as the operator wants it: pace now against the ceiling, how
    long everyone is blocked, what is in flight."""
    if reading.state is None:
        return format_html('<p class="rj-blocked">{}</p>', reading.error)
    state = reading.state
    rows = [
        ("rate now", rate_story_text(state)),
        ("ceiling", f"{per_period_text(state.rate, state.period)} (burst {state.burst})"),
        *(("limit", window_text(window)) for window in state.windows),
        (
            "adaptive",
            f"yes, floor {per_period_text(state.min_rate, state.period)}"
            if state.adaptive
            else "no",
        ),
        (
            "blocked",
            format_html('<span class="rj-blocked">{}</span>', blocked_text(state))
            if state.blocked_for
            else blocked_text(state),
        ),
        (
            "next free slot",
            f"in {seconds_text(state.next_free_in)}" if state.next_free_in else "now",
        ),
        ("in flight", in_flight_text(state)),
    ]
    return format_html(
        '<table class="rj-state">{}</table>',
        format_html(
            "".join("<tr><th>{}</th><td>{}</td></tr>" for _ in rows),
            *[cell for row in rows for cell in row],
        ),
    )


def reset_consequences(api: Api) -> list[str]:
    """What a reset of the API's limiter forgets (services.apis.api_limiter_reset deletes the
    live state and every credential key's bucket; the configuration stays), with today's values
    where Redis answers."""
    kept = (
        "Kept: the limits as configured on this page, the recorded throttle events, the jobs "
        "and their calls."
    )
    reading = api_limiter_readings([api])[api.pk]
    if reading.state is None:
        return [
            f"The limiter's state cannot be read now ({reading.error}). A reset forgets the pace, "
            "any block, the adaptive rate and the learned limit, the in-flight leases, what is "
            "used of each window, the limiter's counts and every credential key's bucket.",
            kept,
        ]
    state = reading.state
    lines = [
        f"The pace is forgotten: the next calls may go at once, up to the burst of {state.burst}."
    ]
    if state.windows:
        limits = "; ".join(window_text(window) for window in state.windows)
        lines.append(f"Every other limit starts full again; now: {limits}.")
    if state.blocked_for:
        lines.append(f"The block is lifted: {blocked_text(state)}.")
    else:
        lines.append("There is no block now; none is kept.")
    ceiling = per_period_text(state.rate, state.period)
    if state.adaptive and state.current_rate < state.rate:
        lines.append(
            "The adaptive rate goes back to the ceiling: from "
            f"{per_period_text(state.current_rate, state.period)} to {ceiling}."
        )
    elif state.adaptive:
        lines.append(f"The adaptive rate is already at the ceiling, {ceiling}.")
    if state.adaptive and state.learned_rate is not None:
        lines.append(
            f"The learned limit, {per_period_text(state.learned_rate, state.period)}, is "
            "forgotten; the limiter learns it again from the next 429s."
        )
    elif state.adaptive:
        lines.append("No limit was learned yet: nothing to forget there.")
    if not state.in_flight:
        lines.append("No call holds an in-flight lease now.")
    else:
        lines.append(
            f"The {state.in_flight} in-flight lease(s) are dropped: calls on the wire now "
            "finish, "
            + (
                f"but no longer count against the in-flight cap of {state.max_concurrency}."
                if state.max_concurrency
                else "as they would anyway (no in-flight cap)."
            )
        )
    lines.append(
        f"The limiter's counts ({state.counts.grants} grants, {state.counts.throttles} 429s so "
        "far, as /metrics exports them) start again from zero."
    )
    try:
        live_keys = api_key_buckets(api).live
    except LimiterError:
        lines.append("Every credential key's bucket is reset the same way.")
    else:
        lines.append(f"The live buckets of {live_keys} credential key(s) are reset the same way.")
    return [*lines, kept]


def longer_block_text(api: Api, seconds: float) -> str:
    """A block never shortens one in place (the limiter keeps the later end): say so when the
    API is blocked for longer already."""
    state = api_limiter_readings([api])[api.pk].state
    if state is not None and state.blocked_for > seconds:
        return f"It is {blocked_text(state)} already: that longer block is kept."
    return "A longer block already in place (a Retry-After, say) would be kept."


def block_consequences(api: Api, seconds: float) -> list[str]:
    """What a manual block (services.apis.api_block) does, and until when, were it confirmed
    now."""
    until = timezone.now() + timedelta(seconds=seconds)
    waiting = Job.objects.filter(api=api, status__in=Job.ACTIVE).count()
    return [
        f"Every worker stops sending calls to “{api}” for {seconds_text(seconds)}: until "
        f"{moment_text(until)} if you confirm now.",
        f"{waiting} running or queued job(s) on this API wait meanwhile; calls waiting for "
        "their slot are sent after the block, calls already on the wire finish.",
        longer_block_text(api, seconds),
        "The block is recorded as a throttle event (“limiter blocked”) and shown on the API's "
        "and its jobs' pages; a reset of the limiter lifts it early.",
    ]


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
class ApiAdmin(ShownFiltersOnly, ManagerAccess, admin.ModelAdmin):
    form = ApiAdminForm
    change_form_template = "admin/ratejobs/api/change_form.html"
    list_display = (
        "name",
        "base_url_column",
        "limit_column",
        "adaptive",
        "current_rate_column",
        "blocked_column",
        "in_flight_column",
        "credential_column",
    )
    search_fields = ("name", "base_url")
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
        ("Record", {"fields": ("created_clock", "updated_clock")}),
    )

    created_clock = clock_column("created")
    updated_clock = clock_column("updated")

    class Media:
        css = {"all": ("ratejobs/admin.css",)}

    def get_fieldsets(self, request: HttpRequest, obj: Api | None = None) -> Any:
        if self.has_change_permission(request, obj):
            return self.fieldsets
        # Read-only for those who may not manage APIs: a default header's value may be a key,
        # and the credential's inputs have nothing to show.
        shown = {"default_headers": "default_header_names", "limits": "limits_text",
                 "credential": None, "clear_credential": None,
                 "credential_to_new_origin": None}  # fmt: skip
        return tuple(
            (title, {"fields": tuple(
                shown.get(name, name) for name in options["fields"] if shown.get(name, name)
            )})
            for title, options in self.fieldsets
        )  # fmt: skip

    @admin.display(description="default headers")
    def default_header_names(self, api: Api) -> str:
        return ", ".join(f"{name}: {MASK}" for name in api.default_headers) or "none"

    @admin.display(description="more limits")
    def limits_text(self, api: Api) -> str:
        """One window a line: "1,000 requests per 1 hour, burst 100"."""
        return windows_html(api.limits)

    def get_readonly_fields(self, request: HttpRequest, obj: Api | None = None) -> tuple:
        fixed = ("credential_status", "default_header_names", "limits_text", "created_clock",
                 "updated_clock")  # fmt: skip
        return ("name", *fixed) if obj is not None else fixed

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ApiChangeList

    @admin.display(description="stored credential")
    def credential_status(self, api: Api) -> str:
        return credential_text(api)

    @admin.display(description="credential")
    def credential_column(self, api: Api) -> str:
        if api.credential_encrypted:
            return "stored (encrypted)"
        return clipped(f"env {api.credential_env}") if api.credential_env else "none"

    @admin.display(description="base URL", ordering="base_url")
    def base_url_column(self, api: Api) -> str:
        return clipped(api.base_url)

    @admin.display(description="limit", ordering="rate")
    def limit_column(self, api: Api) -> str:
        more = f" + {len(api.limits)} more" if api.limits else ""
        return f"{per_period_text(api.rate, api.period)} (burst {api.burst}){more}"

    @admin.display(description="rate now")
    def current_rate_column(self, api: Api) -> str:
        state = api.limiter_reading.state
        return "?" if state is None else rate_text(state.current_rate / state.period)

    @admin.display(description="blocked")
    def blocked_column(self, api: Api) -> str:
        state = api.limiter_reading.state
        if state is None:
            return "?"
        if not state.blocked_for:
            return "—"
        return format_html('<span class="rj-blocked">{}</span>', seconds_text(state.blocked_for))

    @admin.display(description="in flight")
    def in_flight_column(self, api: Api) -> str:
        state = api.limiter_reading.state
        return "?" if state is None else in_flight_text(state)

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
            # reset and block answer a GET with their confirmation page (admin.confirm)
            path("<int:api_id>/reset/", wrap(self.reset_view), name="ratejobs_api_reset"),
            path("<int:api_id>/block/", wrap(self.block_view), name="ratejobs_api_block"),
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

    def _back(self, api: Api) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:ratejobs_api_change", args=[api.pk]))

    def reset_view(self, request: HttpRequest, api_id: int) -> HttpResponse:
        api = self._api_for_action(request, api_id)
        if not confirmed(request):
            return confirmation_page(
                request,
                self,
                obj=api,
                action="Reset limiter",
                question=f"Are you sure you want to reset the shared limiter of “{api}”? "
                "Every worker starts again from a clean state; this cannot be undone.",
                summary=reset_consequences(api),
                confirm_label="Yes, reset the limiter",
                back_url=self._back(api).url,
            )
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
        given = (request.POST if request.method == "POST" else request.GET).get("seconds", "")
        try:
            seconds = float(given)
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
        if not confirmed(request):
            return confirmation_page(
                request,
                self,
                obj=api,
                action="Block",
                question=f"Are you sure you want to stop every worker calling “{api}” for "
                f"{seconds_text(seconds)}?",
                summary=block_consequences(api, seconds),
                confirm_label=f"Yes, block it for {seconds_text(seconds)}",
                back_url=self._back(api).url,
                hidden=[("seconds", given)],
            )
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
            # one row per response (its 429 and the rate cut it caused), as on the job page
            recent_events = list(throttle_event_story(recent).select_related("job")[:10])
            for event in recent_events:
                event.story_text = throttle_event_text(event, period=api.period)
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
