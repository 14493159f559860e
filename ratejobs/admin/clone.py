"""Running a job again from its admin page (services.jobs.job_clone): a "Run again" form,
all the calls or only the failed ones, that POSTs to an admin URL of JobAdmin and lands on the
new job's page.

JobAdmin adds `clone_urls(self)` to its get_urls, and the job page includes
admin/ratejobs/job/_clone.html twice: its controls (part="controls") among the job's action
buttons, and its form (part="form") after the change form, since forms cannot nest.

POST only, like pause, resume and retry-failed (a GET is a 405): a clone is undone by
cancelling the new job, so it asks no "Are you sure?" as the cancel does.
"""

from __future__ import annotations

from functools import partial

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse

from ratejobs.services.jobs import JobCloneRefused, job_clone

URL_NAME = "ratejobs_job_clone"
# The form's `calls` choices, as the REST API names them.
CLONE_CALLS = {"all": False, "failed": True}  # name -> only_failed


def clone_urls(model_admin: admin.ModelAdmin) -> list[URLPattern]:
    """The clone's URL, `<job id>/clone/` under the job admin's own, behind the admin's login."""
    view = model_admin.admin_site.admin_view(partial(clone_view, model_admin))
    return [path("<int:job_id>/clone/", view, name=URL_NAME)]


def clone_view(model_admin: admin.ModelAdmin, request: HttpRequest, job_id: int) -> HttpResponse:
    """Make the clone and go to its page, or back to the job's page saying why not."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    # the admin's queryset: someone else's job is a 404 to all but a superuser, as its page is
    job = get_object_or_404(model_admin.get_queryset(request), pk=job_id)
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    page_url = reverse("admin:ratejobs_job_change", args=[job.pk])
    calls = request.POST.get("calls", "")
    if calls not in CLONE_CALLS:
        model_admin.message_user(
            request, "Choose which calls to run again: all, or the failed ones.", messages.ERROR
        )
        return HttpResponseRedirect(page_url)
    try:
        clone = job_clone(job=job, owner=request.user, only_failed=CLONE_CALLS[calls])
    except (JobCloneRefused, PermissionDenied) as exc:
        model_admin.message_user(request, str(exc), messages.WARNING)
        return HttpResponseRedirect(page_url)
    except ValidationError as exc:  # a limit of theirs, no call to copy, a call now invalid
        model_admin.message_user(request, " ".join(exc.messages), messages.ERROR)
        return HttpResponseRedirect(page_url)
    which = "failed calls" if CLONE_CALLS[calls] else "calls"
    model_admin.message_user(
        request,
        f"Job “{clone.name}” made to run the {which} of “{job.name}” again: {clone.total} calls.",
        messages.SUCCESS,
    )
    return HttpResponseRedirect(reverse("admin:ratejobs_job_change", args=[clone.pk]))
