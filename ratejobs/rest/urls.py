"""Routes of the REST API, mounted under api/ by ratejobs.urls."""

from __future__ import annotations

from django.urls import path, re_path

from ratejobs.rest import apis, credentials, index, jobs, signing_keys
from ratejobs.rest.views import SchemaView, SwaggerView

app_name = "api"

urlpatterns = [
    path("", index.IndexView.as_view(), name="index"),
    path("apis/", apis.ApiListCreateView.as_view(), name="api-list"),
    path("apis/<slug:name>/", apis.ApiDetailView.as_view(), name="api-detail"),
    path(
        "apis/<slug:name>/credentials/",
        credentials.ApiCredentialListView.as_view(),
        name="api-credentials",
    ),
    path(
        "apis/<slug:name>/credentials/<str:key>/",
        credentials.ApiCredentialDetailView.as_view(),
        name="api-credential-detail",
    ),
    path("jobs/", jobs.JobListCreateView.as_view(), name="job-list"),
    path("jobs/upload/", jobs.JobUploadView.as_view(), name="job-upload"),
    path("jobs/<int:job_id>/", jobs.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/calls/", jobs.JobCallListView.as_view(), name="job-calls"),
    path(
        "jobs/<int:job_id>/calls/<int:index>/",
        jobs.JobCallDetailView.as_view(),
        name="job-call-detail",
    ),
    path(
        "jobs/<int:job_id>/results.jsonl",
        jobs.JobResultsJsonlView.as_view(),
        name="job-results-jsonl",
    ),
    path("jobs/<int:job_id>/results.csv", jobs.JobResultsCsvView.as_view(), name="job-results-csv"),
    path("jobs/<int:job_id>/events/", jobs.JobThrottleEventListView.as_view(), name="job-events"),
    path("jobs/<int:job_id>/pause/", jobs.JobPauseView.as_view(), name="job-pause"),
    path("jobs/<int:job_id>/resume/", jobs.JobResumeView.as_view(), name="job-resume"),
    path("jobs/<int:job_id>/cancel/", jobs.JobCancelView.as_view(), name="job-cancel"),
    path(
        "jobs/<int:job_id>/retry-failed/",
        jobs.JobRetryFailedView.as_view(),
        name="job-retry-failed",
    ),
    path("jobs/<int:job_id>/clone/", jobs.JobCloneView.as_view(), name="job-clone"),
    path("signing-key/", signing_keys.SigningKeyView.as_view(), name="signing-key"),
    path("schema/", SchemaView.as_view(), name="schema"),
    # GET and HEAD only: its HTML renderer has no template for an OPTIONS answer (a 500)
    path(
        "docs/",
        SwaggerView.as_view(url_name="api:schema", http_method_names=["get", "head"]),
        name="docs",
    ),
    # Last: whatever matched no route above, newlines included (`.` would stop at one).
    re_path(r"^(?P<rest>[\s\S]*)\Z", index.not_found, name="not-found"),
]
