"""Jobs in the admin: submit one, follow its progress, pace and 429s, act on it, purge it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import F, FloatField, QuerySet
from django.db.models.functions import Cast, Greatest
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timezone import localtime
from django.views.decorators.http import require_POST

from ratejobs.admin.access import StaffAccess, sees_every_job
from ratejobs.admin.charts import timeline_svg
from ratejobs.admin.forms import JobSubmitForm
from ratejobs.models import Job
from ratejobs.selectors.jobs import (
    duration_text,
    failed_call_sample,
    job_eta_seconds,
    job_paces,
    job_timeline,
    throttle_event_list_for_job,
)
from ratejobs.selectors.results import RESULTS_FORMATS, job_results_response
from ratejobs.services.jobs import (
    JOB_ACTIONS,
    CallsInvalid,
    JobActionRefused,
    job_act,
    job_actions_allowed,
    job_create,
)
from ratejobs.services.retention import JobPurgeRefused, job_purge_refusal, job_purge_request
from ratejobs.uploads import UploadError

EVENTS_PER_PAGE = 20
# What the operator reads once an action went through.
ACTION_DONE = {
    "pause": "paused; no new call starts until it is resumed",
    "resume": "resumed",
    "cancel": "cancelled; calls not yet started will not be sent",
    "retry-failed": "failed calls queued again",
}


def moment_text(moment: datetime | None) -> str:
    """A time as the admin shows it elsewhere (local time, the locale's format)."""
    return "—" if moment is None else date_format(localtime(moment), "DATETIME_FORMAT")


def progress_bar(job: Job) -> str:
    percent = job.progress * 100
    return format_html(
        '<div class="rj-progress" role="progressbar" aria-valuenow="{}" aria-valuemin="0" '
        'aria-valuemax="100" data-status="{}"><div class="rj-progress-fill" style="width: {}%">'
        '</div><span class="rj-progress-text">{}%</span></div>',
        f"{percent:.0f}",
        job.status,
        f"{percent:.1f}",
        f"{int(percent)}",
    )


def job_progress_data(job: Job, pace: float) -> dict[str, Any]:
    """What the job page polls for while the job runs."""
    return {
        "id": job.pk,
        "status": job.status,
        "status_display": job.get_status_display(),
        "total": job.total,
        "done": job.done,
        "succeeded": job.succeeded,
        "failed": job.failed,
        "cancelled": job.cancelled,
        "throttled": job.throttled,
        "retries": job.retries,
        "progress": round(job.progress * 100, 1),
        "pace": round(pace, 2),
        "eta": duration_text(job_eta_seconds(job, pace)),
        "started": moment_text(job.started),
        "finished": moment_text(job.finished),
        "actions": job_actions_allowed(job),
        "final": job.status in (Job.Status.CANCELLED, Job.Status.COMPLETED),
    }


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
class JobAdmin(StaffAccess, admin.ModelAdmin):
    list_display = (
        "name",
        "api",
        "owner",
        "status",
        "progress_column",
        "succeeded",
        "failed",
        "throttled_column",
        "pace_column",
        "eta_column",
        "created",
    )
    list_display_links = ("name",)
    list_filter = ("status", "api", ("owner", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name", "api__name", "owner__username")
    date_hierarchy = "created"
    list_per_page = 100
    show_full_result_count = False
    ordering = ("-created",)
    change_form_template = "admin/ratejobs/job/change_form.html"
    actions = ["purge_selected"]
    # Status, counters and timings live in the progress box above, which keeps itself current.
    readonly_fields = (
        "name", "api", "credential_key", "owner", "priority", "created", "not_before", "deadline",
    )  # fmt: skip
    fields = readonly_fields
    # The delivery of the job's callback (services.callbacks), under the job's own fields.
    callback_fields = (
        "callback_url",
        "callback_status",
        "callback_attempts",
        "callback_last_error",
        "callback_next_attempt_at",
        "callback_delivered_at",
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> tuple:
        return (*super().get_readonly_fields(request, obj), *self.callback_fields)

    def get_fields(self, request: HttpRequest, obj: Job | None = None) -> tuple:
        shown = (*super().get_fields(request, obj), *self.callback_fields)
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
        return ("status", "api")

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
        pace = getattr(job, "pace", 0.0)
        return f"{pace:.1f}/s" if job.started else "—"

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
        if request.method == "POST" and form.is_valid():
            job = self._submit(request, form)
            if job is not None:
                self.message_user(
                    request, f"Job “{job.name}” submitted with {job.total} calls.", messages.SUCCESS
                )
                return HttpResponseRedirect(reverse("admin:ratejobs_job_change", args=[job.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": "Submit a job",
            "form": form,
            "opts": self.model._meta,
            "has_view_permission": True,
        }
        return TemplateResponse(request, "admin/ratejobs/job/submit.html", context)

    def _submit(self, request: HttpRequest, form: JobSubmitForm) -> Job | None:
        data = form.cleaned_data
        source = "calls_file" if data.get("calls_file") else "values"
        try:
            calls = form.call_specs()
            return job_create(
                owner=request.user,
                api=data["api"],
                name=data["name"],
                priority=data["priority"],
                not_before=data.get("not_before"),
                deadline=data.get("deadline"),
                callback_url=data.get("callback_url") or "",
                credential_key=data.get("credential_key") or "",
                calls=calls,
            )
        except UploadError as exc:
            form.add_error(source, str(exc))
        except CallsInvalid as exc:  # by line of the file or of the values, not call index
            for message in calls.error_messages(exc):
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
            path(
                "<int:job_id>/progress/",
                wrap(self.progress_view),
                name="ratejobs_job_progress",
            ),
            path(
                "<int:job_id>/act/<str:action>/",
                wrap(require_POST(self.action_view)),
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
        if request.GET.get("chart"):
            data["chart"] = str(timeline_svg(job_timeline(job)))
        return JsonResponse(data)

    def results_view(self, request: HttpRequest, job_id: int, format: str) -> HttpResponseBase:
        """The job's results file, as the REST API serves it, to whoever sees the job here."""
        job = self._job_for(request, job_id)
        if format not in RESULTS_FORMATS:
            raise Http404("no such format")
        return job_results_response(job, format)

    def action_view(self, request: HttpRequest, job_id: int, action: str) -> HttpResponse:
        job = self._job_for(request, job_id)
        if action not in JOB_ACTIONS or not self.has_change_permission(request, job):
            raise PermissionDenied
        try:
            job = job_act(job=job, action=action)
        except JobActionRefused as exc:
            self.message_user(request, str(exc), messages.WARNING)
        else:
            self.message_user(request, f"{job}: {ACTION_DONE[action]}.")
        return HttpResponseRedirect(reverse("admin:ratejobs_job_change", args=[job.pk]))

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
            events = Paginator(throttle_event_list_for_job(job), EVENTS_PER_PAGE)
            context.update(
                job_progress=job_progress,
                job_progress_bar=progress_bar(job),
                job_chart=timeline_svg(job_timeline(job)),
                throttle_events=events.get_page(request.GET.get("events")),
                failed_calls=failed_call_sample(job),
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
            "refused": [(job, refusal) for job, refusal in refusals if refusal is not None],
            "action": action,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/ratejobs/job/purge_confirmation.html", context)
