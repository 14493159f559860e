"""Jobs in the admin: submit one, follow its progress, pace and 429s, act on it, purge it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Page, Paginator
from django.db.models import F, FloatField, QuerySet
from django.db.models.functions import Cast, Greatest
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html

from ratejobs.admin.access import StaffAccess, sees_every_job
from ratejobs.admin.calls import job_calls_links_html
from ratejobs.admin.cells import clock_column
from ratejobs.admin.charts import job_chart_svg
from ratejobs.admin.clone import clone_urls
from ratejobs.admin.confirm import confirmation_page, confirmed
from ratejobs.admin.forms import JobSubmitForm
from ratejobs.admin.lookups import ShownFiltersOnly
from ratejobs.admin.titles import RecordTitles
from ratejobs.models import Call, Job, ThrottleEvent
from ratejobs.selectors.job_chart import job_block_notice, job_chart
from ratejobs.selectors.jobs import (
    OUTCOME_LABELS,
    STORY_MAX_EVENTS,
    call_indexes,
    failed_call_sample,
    job_average_rate,
    job_done_text,
    job_duration_seconds,
    job_eta_seconds,
    job_eta_text,
    job_filter_by_outcome,
    job_is_final,
    job_outcome,
    job_pace_text,
    job_paces,
    job_ran,
    throttle_event_story_for_job,
    throttle_event_story_since,
)
from ratejobs.selectors.results import RESULTS_FORMATS, job_results_response
from ratejobs.services.jobs import (
    JOB_ACTIONS,
    JobActionRefused,
    job_act,
    job_action_refusal,
    job_actions_allowed,
)
from ratejobs.services.retention import JobPurgeRefused, job_purge_refusal, job_purge_request
from ratejobs.text import duration_text, moment_text, rate_text, seconds_text, throttle_event_text
from ratejobs.uploads import CALL_COLUMNS, UploadError, job_submit_from_file

EVENTS_PER_PAGE = 20
EventRows = list[tuple[ThrottleEvent, str, int | None]]
# What the operator reads once an action went through.
ACTION_DONE = {
    "pause": "paused; no new call starts until it is resumed",
    "resume": "resumed",
    "cancel": "cancelled; calls not yet started will not be sent",
    "retry-failed": "failed calls queued again",
}
# Actions that cannot be taken back: their URL answers a GET, or a POST without post=yes, with
# an "Are you sure?" page (admin.confirm). Pause, resume and retry are undone by another click.
ACTIONS_CONFIRMED = ("cancel",)


def cancel_consequences(job: Job) -> list[str]:
    """What cancelling the job does to its calls (services.jobs.job_cancel), counted now."""
    running = job.calls.filter(status=Call.Status.RUNNING).count()
    not_started = max(0, job.total - job.done - running)
    lines = [
        f"{not_started} of its {job.total} calls not yet sent (or waiting for a retry) are "
        "cancelled: they will not be sent.",
        f"{running} call(s) on the wire now finish, and their outcomes are recorded.",
        f"Kept: the {job.succeeded} succeeded and {job.failed} failed calls so far, their "
        "responses and the results files.",
    ]
    if job.callback_url:
        lines.append(f"The job's callback is sent to {job.callback_url}, saying “cancelled”.")
    return lines


def progress_shares(job: Job) -> tuple[float, float]:
    """Percent of the job's calls that ran (succeeded or failed; 100 for a job of none), and
    percent cancelled before they were sent."""
    if not job.total:
        return 100.0, 0.0
    return 100.0 * job_ran(job) / job.total, 100.0 * job.cancelled / job.total


def progress_bar(job: Job) -> str:
    """The calls that ran, coloured by how the job stands (green only when every call
    succeeded, amber with failures, red when all failed, grey when cancelled), and those
    cancelled unsent as a grey stretch after them."""
    outcome = job_outcome(job)
    ran, cancelled = progress_shares(job)
    return format_html(
        '<div class="rj-progress" role="progressbar" aria-valuenow="{}" aria-valuemin="0" '
        'aria-valuemax="100" data-outcome="{}" title="{}: {}">'
        '<div class="rj-progress-fill" style="width: {}%"></div>'
        '<div class="rj-progress-cancelled" style="width: {}%"></div>'
        '<span class="rj-progress-text">{}%</span></div>',
        f"{ran:.0f}",
        outcome.key,
        outcome.label,
        job_done_text(job),
        f"{ran:.1f}",
        f"{cancelled:.1f}",
        f"{int(ran)}",
    )


def job_progress_data(job: Job, pace: float) -> dict[str, Any]:
    """What the job page polls for while the job runs. A finished job's pace is its average
    rate over its run: the last minute's would decay to nothing after the end."""
    outcome = job_outcome(job)
    final = job_is_final(job)
    average = job_average_rate(job)
    notice = job_block_notice(job)
    ran, cancelled = progress_shares(job)
    eta_seconds = job_eta_seconds(job, pace)
    return {
        "id": job.pk,
        "status": job.status,
        "outcome": outcome.key,
        "status_display": outcome.label,
        "total": job.total,
        "done": job.done,
        "done_text": job_done_text(job),
        "succeeded": job.succeeded,
        "failed": job.failed,
        "cancelled": job.cancelled,
        "throttled": job.throttled,
        "retries": job.retries,
        "progress": round(job.progress * 100, 1),
        "ran_percent": round(ran, 1),
        "cancelled_percent": round(cancelled, 1),
        "pace": round(average if final and average is not None else pace, 2),
        "pace_text": job_pace_text(job, pace, average),
        "average_rate": rate_text(average),
        "duration": seconds_text(job_duration_seconds(job)),
        # "eta" always names a duration (the browser test's units); why there is none goes
        # under "eta_note" instead, and the page shows whichever field "eta_field" names.
        "eta": duration_text(eta_seconds),
        "eta_field": "eta" if eta_seconds is not None else "eta_note",
        "eta_note": "" if eta_seconds is not None else job_eta_text(job, pace),
        "started": moment_text(job.started),
        "finished": moment_text(job.finished),
        "actions": job_actions_allowed(job),
        "final": final,
        "blocked": None if notice is None else notice.as_json(),
        # The final counts by status code, once: the page polls no more after this answer.
        "calls_links": job_calls_links_html(job) if final else None,
    }


def job_events_page(job: Job, number: str | int | None = 1) -> tuple[Page, EventRows]:
    """A page of the job's throttle events (throttle_event_story_for_job), and its rows: each
    event with what happened in words and the index of its call in the job."""
    page = Paginator(throttle_event_story_for_job(job), EVENTS_PER_PAGE).get_page(number)
    period, indexes = job.api.period, call_indexes(page)
    return page, [
        (event, throttle_event_text(event, period=period), indexes.get(event.call_id))
        for event in page
    ]


def events_rows_html(rows: EventRows) -> str:
    return render_to_string("admin/ratejobs/job/_event_rows.html", {"throttle_event_rows": rows})


def failed_calls_html(job: Job) -> str:
    context = {"failed_calls": failed_call_sample(job), "job_id": job.pk}
    return render_to_string("admin/ratejobs/job/_failed_calls.html", context)


class OutcomeFilter(admin.SimpleListFilter):
    """Jobs by how they stand or ended (job_outcome), finer than their status."""

    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return list(OUTCOME_LABELS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        key = self.value()
        return queryset if key not in OUTCOME_LABELS else job_filter_by_outcome(queryset, key)


class JobChangeList(ChangeList):
    """Measures the pace of the page's jobs in one query once the page is known, so the
    number of queries does not grow with the rows shown."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        paces = job_paces(self.result_list)
        for job in self.result_list:
            job.pace = paces.get(job.pk, 0.0)


@admin.register(Job)
class JobAdmin(RecordTitles, ShownFiltersOnly, StaffAccess, admin.ModelAdmin):
    list_display = (
        "name",
        "api",
        "owner",
        "status_column",
        "progress_column",
        "calls_column",
        "succeeded",
        "failed",
        "throttled_column",
        "pace_column",
        "eta_column",
        "created_clock",
    )
    list_display_links = ("name",)
    list_filter = (OutcomeFilter, "api", ("owner", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name", "api__name", "owner__username")
    date_hierarchy = "created"
    list_per_page = 100
    show_full_result_count = False
    ordering = ("-created",)
    change_form_template = "admin/ratejobs/job/change_form.html"
    actions = ["purge_selected"]
    # Status, counters and timings live in the progress box above, which keeps itself current.
    # Times to the second (Django's own rendering shows the minute only).
    created_clock = clock_column("created")
    not_before_clock = clock_column("not_before", "not before")
    deadline_clock = clock_column("deadline")
    callback_next_attempt_clock = clock_column("callback_next_attempt_at", "callback next attempt")
    callback_delivered_clock = clock_column("callback_delivered_at", "callback delivered")
    readonly_fields = (
        "name", "api_link", "credential_key", "owner", "priority", "created_clock",
        "not_before_clock", "deadline_clock", "calls_links",
    )  # fmt: skip
    fields = readonly_fields
    # The delivery of the job's callback (services.callbacks), under the job's own fields.
    # Only on a job that has a callback: on the others they would be rows of "—".
    callback_fields = (
        "callback_url_text",
        "callback_status",
        "callback_attempts",
        "callback_last_error",
        "callback_next_attempt_clock",
        "callback_delivered_clock",
    )

    def _callback_fields(self, obj: Job | None) -> tuple[str, ...]:
        return self.callback_fields if obj is not None and obj.callback_url else ()

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> tuple:
        return (*super().get_readonly_fields(request, obj), *self._callback_fields(obj))

    def get_fields(self, request: HttpRequest, obj: Job | None = None) -> tuple:
        shown = (*super().get_fields(request, obj), *self._callback_fields(obj))
        return tuple(dict.fromkeys(shown))

    class Media:
        css = {"all": ("ratejobs/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        jobs = super().get_queryset(request).select_related("api", "owner")
        jobs = jobs.filter(purge_started__isnull=True)  # one being purged is gone already
        if not sees_every_job(request):
            jobs = jobs.filter(owner=request.user)
        return jobs

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        # Django's bulk delete loads every call of a job, bodies and all, and deletes them in
        # one long transaction; a purge goes in short batches instead.
        actions.pop("delete_selected", None)
        return actions

    def get_list_filter(self, request: HttpRequest) -> Any:
        if sees_every_job(request):
            return self.list_filter
        return (OutcomeFilter, "api")

    # Labels as operators write them ("API", "URL"); the model's verbose names would read
    # "Api" and "Callback url", and changing them would take a migration.
    @admin.display(description="API")
    def api_link(self, job: Job) -> str:
        """The job's API, linked to its page as Django links a read-only foreign key."""
        try:
            url = reverse(
                "admin:ratejobs_api_change", args=[job.api_id], current_app=self.admin_site.name
            )
        except NoReverseMatch:
            return str(job.api)
        return format_html('<a href="{}">{}</a>', url, job.api)

    @admin.display(description="callback URL")
    def callback_url_text(self, job: Job) -> str:
        return job.callback_url

    @admin.display(description="calls", ordering="total")
    def calls_column(self, job: Job) -> int:
        """The job's size: how many calls it was submitted with."""
        return job.total

    @admin.display(description="calls")
    def calls_links(self, job: Job) -> str:
        """Links to the job's calls in the Calls list: all, failed, by status code."""
        return job_calls_links_html(job)

    @admin.display(description="status", ordering="status")
    def status_column(self, job: Job) -> str:
        outcome = job_outcome(job)
        return format_html('<span class="rj-outcome" data-outcome="{}">{}</span>', *outcome)

    @admin.display(
        description="progress",
        ordering=Cast(F("succeeded") + F("failed") + F("cancelled"), FloatField())
        / Greatest(F("total"), 1),
    )
    def progress_column(self, job: Job) -> str:
        return progress_bar(job)

    @admin.display(description="429s", ordering="throttled")
    def throttled_column(self, job: Job) -> int:
        return job.throttled

    @admin.display(description="pace")
    def pace_column(self, job: Job) -> str:
        """The last minute's pace while the job may still run; a finished one's average."""
        if job.started is None:
            return "—"
        if job_is_final(job):
            return f"{rate_text(job_average_rate(job))} (average)"
        return rate_text(getattr(job, "pace", 0.0))

    @admin.display(description="ETA")
    def eta_column(self, job: Job) -> str:
        return duration_text(job_eta_seconds(job, getattr(job, "pace", 0.0)))

    # --- submitting ---------------------------------------------------------------------

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = JobSubmitForm(request.POST or None, request.FILES or None, user=request.user)
        if request.method == "POST":
            job = self._submit(request, form) if form.is_valid() else None
            if job is not None:
                form.forget_kept_upload()
                self.message_user(
                    request, f"Job “{job.name}” submitted with {job.total} calls.", messages.SUCCESS
                )
                return HttpResponseRedirect(reverse("admin:ratejobs_job_change", args=[job.pk]))
            form.keep_upload_for_next_try()
        context = {
            **self.admin_site.each_context(request),
            "title": "Submit a job",
            "form": form,
            "opts": self.model._meta,
            "has_view_permission": True,
            "call_columns": CALL_COLUMNS,
        }
        return TemplateResponse(request, "admin/ratejobs/job/submit.html", context)

    def _submit(self, request: HttpRequest, form: JobSubmitForm) -> Job | None:
        data = form.cleaned_data
        source = "calls_file" if data.get("calls_file") else "values"
        try:
            job, _ = job_submit_from_file(
                owner=request.user,
                api=data["api"],
                name=data["name"],
                priority=data["priority"],
                not_before=data.get("not_before"),
                deadline=data.get("deadline"),
                callback_url=data.get("callback_url") or "",
                credential_key=data.get("credential_key") or "",
                calls=form.call_specs(),
            )
            return job
        except UploadError as exc:  # every bad line, by line of the file or of the values
            for message in exc.messages():
                form.add_error(source, message)
        except ValidationError as exc:
            errors = exc.message_dict if hasattr(exc, "error_dict") else {None: exc.messages}
            for field, messages in errors.items():
                for message in messages:  # under its own field where the form has one
                    form.add_error(field if field in form.fields else None, message)
        return None

    # --- following and acting ------------------------------------------------------------

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        return [
            *clone_urls(self),
            path(
                "<int:job_id>/progress/",
                wrap(self.progress_view),
                name="ratejobs_job_progress",
            ),
            path(
                "<int:job_id>/act/<str:action>/",
                wrap(self.action_view),  # a GET shows a confirmation (ACTIONS_CONFIRMED)
                name="ratejobs_job_act",
            ),
            path(
                "<int:job_id>/results.<str:format>",
                wrap(self.results_view),
                name="ratejobs_job_results",
            ),
            *super().get_urls(),
        ]

    def _job_for(self, request: HttpRequest, job_id: int) -> Job:
        return get_object_or_404(self.get_queryset(request), pk=job_id)

    def progress_view(self, request: HttpRequest, job_id: int) -> JsonResponse:
        job = self._job_for(request, job_id)
        data = job_progress_data(job, job_paces([job]).get(job.pk, 0.0))
        # The chart also when the block the page shows ("shown_block", its banner's key: "" for
        # none) began, ended or gave way to another since: the banner and the block's shaded
        # span appear together, a 429's second block and an operator's after it alike.
        shown_block = request.GET.get("shown_block")
        blocked = data["blocked"]
        block_moved = shown_block is not None and shown_block != (blocked["key"] if blocked else "")
        if request.GET.get("chart") or block_moved:
            data["chart"] = str(job_chart_svg(job_chart(job)))
        if request.GET.get("events"):  # the first page, as the page shows it on load
            events, rows = job_events_page(job)
            data["events_count"] = events.paginator.count
            data["events_pages"] = events.paginator.num_pages
            data["events_rows"] = events_rows_html(rows)
        if request.GET.get("failed"):  # asked for when the count of failed calls changed
            data["failed_html"] = failed_calls_html(job)
        return JsonResponse(data)

    def results_view(self, request: HttpRequest, job_id: int, format: str) -> HttpResponseBase:
        """The job's results file, as the REST API serves it, to whoever sees the job here."""
        job = self._job_for(request, job_id)
        if format not in RESULTS_FORMATS:
            raise Http404("no such format")
        return job_results_response(job, format)

    def action_view(self, request: HttpRequest, job_id: int, action: str) -> HttpResponse:
        if request.method != "POST" and action not in ACTIONS_CONFIRMED:
            return HttpResponseNotAllowed(["POST"])
        job = self._job_for(request, job_id)
        if action not in JOB_ACTIONS or not self.has_change_permission(request, job):
            raise PermissionDenied
        page_url = reverse("admin:ratejobs_job_change", args=[job.pk])
        if action in ACTIONS_CONFIRMED and not confirmed(request):
            refusal = job_action_refusal(job, action)
            if refusal is not None:  # nothing to confirm: say why, as the action would
                self.message_user(request, refusal, messages.WARNING)
                return HttpResponseRedirect(page_url)
            return confirmation_page(
                request,
                self,
                obj=job,
                action=action.capitalize(),
                question=f"Are you sure you want to cancel the job “{job.name}”? "
                "A cancelled job cannot be resumed.",
                summary=cancel_consequences(job),
                confirm_label="Yes, cancel the job",
                back_url=page_url,
            )
        try:
            job = job_act(job=job, action=action)
        except JobActionRefused as exc:
            self.message_user(request, str(exc), messages.WARNING)
        else:
            self.message_user(request, f"{job}: {ACTION_DONE[action]}.")
        return HttpResponseRedirect(page_url)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        # Nothing on the page is edited in place; the job changes only through its actions.
        context = {
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
            **(extra_context or {}),
        }
        if job is not None:
            pace = job_paces([job]).get(job.pk, 0.0)
            job_progress = job_progress_data(job, pace)
            events, event_rows = job_events_page(job, request.GET.get("events"))
            context.update(
                job_progress=job_progress,
                job_progress_bar=progress_bar(job),
                job_chart=job_chart_svg(job_chart(job)),
                throttle_events=events,
                throttle_event_rows=event_rows,
                throttle_events_capped=throttle_event_story_since(job) is not None,
                story_max_events=f"{STORY_MAX_EVENTS:,}",
                failed_calls=failed_call_sample(job),
                job_id=job.pk,
                job_actions=[
                    (name, reverse("admin:ratejobs_job_act", args=[job.pk, name]))
                    for name in JOB_ACTIONS
                ],
                progress_url=reverse("admin:ratejobs_job_progress", args=[job.pk]),
                results_downloads=[
                    (name.upper(), reverse("admin:ratejobs_job_results", args=[job.pk, name]))
                    for name in RESULTS_FORMATS
                ],
            )
        return super().change_view(request, object_id, form_url, extra_context=context)

    # --- purging -------------------------------------------------------------------------

    @admin.action(permissions=["delete"], description="Purge selected finished jobs")
    def purge_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        jobs = list(queryset)
        if request.POST.get("post") != "yes":
            return self._purge_confirmation(request, jobs, action="purge_selected")
        self._purge(request, jobs)
        return None  # back to the list

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict | None = None
    ) -> HttpResponse:
        """The change page's Delete: a purge, as the action does, for the same reason."""
        job = self.get_object(request, unquote(object_id))
        if not self.has_delete_permission(request, job):
            raise PermissionDenied
        if job is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if request.method != "POST" or request.POST.get("post") != "yes":
            return self._purge_confirmation(request, [job], action=None)
        if self._purge(request, [job]):
            return HttpResponseRedirect(reverse("admin:ratejobs_job_changelist"))
        return HttpResponseRedirect(reverse("admin:ratejobs_job_change", args=[job.pk]))

    def _purge(self, request: HttpRequest, jobs: list[Job]) -> int:
        """Ask for the purge of each job; say which went and why the others did not."""
        purged = 0
        for job in jobs:
            try:
                job_purge_request(job=job)
            except JobPurgeRefused as exc:
                self.message_user(request, f"{job}: {exc}", messages.WARNING)
            else:
                purged += 1
        if purged:
            self.message_user(
                request,
                f"{purged} job(s) purged: gone from every list now; their calls, throttle events "
                "and counts are deleted in the background, a few thousand rows at a time.",
                messages.SUCCESS,
            )
        return purged

    def _purge_confirmation(
        self, request: HttpRequest, jobs: list[Job], action: str | None
    ) -> TemplateResponse:
        refusals = [(job, job_purge_refusal(job)) for job in jobs]
        context = {
            **self.admin_site.each_context(request),
            "title": "Purge jobs" if action else f"Purge {jobs[0]}",
            "opts": self.opts,
            "single": None if action else jobs[0],
            "purgeable": [job for job, refusal in refusals if refusal is None],
            "purgeable_outcomes": [
                (job, job_outcome(job).label) for job, refusal in refusals if refusal is None
            ],
            "refused": [(job, refusal) for job, refusal in refusals if refusal is not None],
            "action": action,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/ratejobs/job/purge_confirmation.html", context)
