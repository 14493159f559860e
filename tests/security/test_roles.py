"""The role table: every route of the URLconf (REST, the admin's pages and actions, the
overview, /healthz and /metrics), with every HTTP method it answers, walked as each role against
objects that belong to another user, compared with one table of expected answers
(ratejobs.permissions says why each answer is what it is).

Answers: an HTTP status, or "login" for the admin's redirect to its login page and "gone" for
its redirect to its index (away from an object the person may not see, or from one just deleted
that has no list they may change to go back to). Routes of another user's job, calls and events
are 404 to everyone but a superuser, so their ids stay secret. Each row also tries the methods
that answer as its own does (`same`), and the coverage test asks every route of the URLconf for
every method no row names: anything but a 405 is a row missing from the table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from django.test import Client
from django.urls import URLResolver, get_resolver, resolve
from django.utils import timezone
from django.views.generic import View
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Api, Call, Job, ThrottleEvent, WorkerProcess
from ratejobs.services.credentials import credentials_add
from ratejobs.services.jobs import job_cancel, job_create

ROLES = ("anonymous", "user", "staff", "manager", "superuser")
# The roles that may change an API (ratejobs.permissions.can_manage_apis).
MANAGE_APIS = ["manager", "superuser"]
# Every method a Django view can answer (View.http_method_names).
METHODS = frozenset(name.upper() for name in View.http_method_names)
# Methods a route answers exactly as a row's own method: tried with it, expecting its answers.
HEAD = ("HEAD",)  # DRF's views answer a HEAD with their GET
# Django's admin views, and ours, tell a POST from the rest: every other method is their GET.
NOT_POST = ("HEAD", "OPTIONS", "PUT", "PATCH", "DELETE", "TRACE")
ANY = ("POST", *NOT_POST)  # views that never look at the method
# Django's redirect of an object's bare address to its change page (RedirectView: no TRACE)
REDIRECT = ("HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")
# The world's API and the other URL a payload moves it to (the same origin: no credential needed).
BASE_URL = "https://api.example.com/v1"
OTHER_BASE_URL = "https://api.example.com/v2"


@dataclass(frozen=True)
class Route:
    name: str  # the URL name (checked against the route the path resolves to)
    method: str
    path: str  # formatted with the objects of `world`
    expected: tuple[Any, ...]  # one answer per role, in ROLES order
    data: str = ""  # name of a payload below
    same: tuple[str, ...] = ()  # other methods that get the same answers, tried too
    moves_base_url: bool = False  # its payload moves the world's API to OTHER_BASE_URL
    removes: bool = False  # the superuser's request deletes its object (delete_target)


# fmt: off
REST = [
    Route("api:api-list", "GET", "/api/apis/", (401, 200, 200, 200, 200), same=HEAD),
    Route("api:api-list", "POST", "/api/apis/", (401, 403, 403, 201, 201), "new_api"),
    Route("api:api-list", "OPTIONS", "/api/apis/", (401, 200, 200, 200, 200)),
    Route("api:api-detail", "GET", "/api/apis/{api}/", (401, 200, 200, 200, 200), same=HEAD),
    Route("api:api-detail", "PATCH", "/api/apis/{api}/", (401, 403, 403, 200, 200), "limits",
          moves_base_url=True),
    Route("api:api-detail", "OPTIONS", "/api/apis/{api}/", (401, 200, 200, 200, 200)),
    # customers' credentials are the API's, like its own: managers only, reading included
    Route("api:api-credentials", "GET", "/api/apis/{api}/credentials/",
          (401, 403, 403, 200, 200), same=HEAD),
    Route("api:api-credentials", "POST", "/api/apis/{api}/credentials/",
          (401, 403, 403, 201, 201), "new_credential"),
    Route("api:api-credentials", "OPTIONS", "/api/apis/{api}/credentials/",
          (401, 403, 403, 200, 200)),
    Route("api:api-credential-detail", "PUT", "/api/apis/{api}/credentials/{key}/",
          (401, 403, 403, 200, 200), "secret"),
    Route("api:api-credential-detail", "DELETE", "/api/apis/{api}/credentials/no-such-key/",
          (401, 403, 403, 404, 404)),
    Route("api:api-credential-detail", "OPTIONS", "/api/apis/{api}/credentials/{key}/",
          (401, 403, 403, 200, 200)),
    Route("api:job-list", "GET", "/api/jobs/", (401, 200, 200, 200, 200), same=HEAD),
    Route("api:job-list", "POST", "/api/jobs/", (401, 201, 201, 201, 201), "new_job"),
    Route("api:job-list", "OPTIONS", "/api/jobs/", (401, 200, 200, 200, 200)),
    Route("api:job-upload", "POST", "/api/jobs/upload/?api={api}&name=up",
          (401, 201, 201, 201, 201), "jsonl"),
    Route("api:job-upload", "OPTIONS", "/api/jobs/upload/", (401, 200, 200, 200, 200)),
    Route("api:job-detail", "GET", "/api/jobs/{job}/", (401, 404, 404, 404, 200), same=HEAD),
    # purging deletes results for good: superusers only, and only a finished job
    Route("api:job-detail", "DELETE", "/api/jobs/{done_job}/", (401, 404, 404, 404, 202)),
    Route("api:job-detail", "DELETE", "/api/jobs/{job}/", (401, 404, 404, 404, 409)),
    # OPTIONS describes the route, never the object: the same answer for any id
    Route("api:job-detail", "OPTIONS", "/api/jobs/{job}/", (401, 200, 200, 200, 200)),
    Route("api:job-calls", "GET", "/api/jobs/{job}/calls/", (401, 404, 404, 404, 200),
          same=HEAD),
    Route("api:job-calls", "OPTIONS", "/api/jobs/{job}/calls/", (401, 200, 200, 200, 200)),
    Route("api:job-call-detail", "GET", "/api/jobs/{job}/calls/0/", (401, 404, 404, 404, 200),
          same=HEAD),
    Route("api:job-call-detail", "OPTIONS", "/api/jobs/{job}/calls/0/",
          (401, 200, 200, 200, 200)),
    Route("api:job-events", "GET", "/api/jobs/{job}/events/", (401, 404, 404, 404, 200),
          same=HEAD),
    Route("api:job-events", "OPTIONS", "/api/jobs/{job}/events/", (401, 200, 200, 200, 200)),
    Route("api:job-results-jsonl", "GET", "/api/jobs/{job}/results.jsonl",
          (401, 404, 404, 404, 200), same=HEAD),
    Route("api:job-results-jsonl", "OPTIONS", "/api/jobs/{job}/results.jsonl",
          (401, 200, 200, 200, 200)),
    Route("api:job-results-csv", "GET", "/api/jobs/{job}/results.csv",
          (401, 404, 404, 404, 200), same=HEAD),
    Route("api:job-results-csv", "OPTIONS", "/api/jobs/{job}/results.csv",
          (401, 200, 200, 200, 200)),
    Route("api:job-pause", "POST", "/api/jobs/{job}/pause/", (401, 404, 404, 404, 200)),
    Route("api:job-pause", "OPTIONS", "/api/jobs/{job}/pause/", (401, 200, 200, 200, 200)),
    Route("api:job-resume", "POST", "/api/jobs/{job}/resume/", (401, 404, 404, 404, 409)),
    Route("api:job-resume", "OPTIONS", "/api/jobs/{job}/resume/", (401, 200, 200, 200, 200)),
    Route("api:job-cancel", "POST", "/api/jobs/{job}/cancel/", (401, 404, 404, 404, 200)),
    Route("api:job-cancel", "OPTIONS", "/api/jobs/{job}/cancel/", (401, 200, 200, 200, 200)),
    Route("api:job-retry-failed", "POST", "/api/jobs/{job}/retry-failed/",
          (401, 404, 404, 404, 409)),
    Route("api:job-retry-failed", "OPTIONS", "/api/jobs/{job}/retry-failed/",
          (401, 200, 200, 200, 200)),
    # running a job again makes a job of one's own from one the person may see
    Route("api:job-clone", "POST", "/api/jobs/{job}/clone/", (401, 404, 404, 404, 201), "clone"),
    Route("api:job-clone", "OPTIONS", "/api/jobs/{job}/clone/", (401, 200, 200, 200, 200)),
    # a signing key is always one's own: nobody reaches another's
    Route("api:signing-key", "GET", "/api/signing-key/", (401, 200, 200, 200, 200), same=HEAD),
    Route("api:signing-key", "POST", "/api/signing-key/", (401, 201, 201, 201, 201)),
    Route("api:signing-key", "OPTIONS", "/api/signing-key/", (401, 200, 200, 200, 200)),
    # The API's description is public, as any published API's documentation is.
    Route("api:schema", "GET", "/api/schema/", (200, 200, 200, 200, 200), same=("HEAD", "OPTIONS")),
    Route("api:docs", "GET", "/api/docs/", (200, 200, 200, 200, 200), same=HEAD),
    # Swagger UI's page has no OPTIONS answer to render: it was a 500 to everyone
    Route("api:docs", "OPTIONS", "/api/docs/", (405, 405, 405, 405, 405)),
    # So is the index of links; a path under /api/ that names no route is a 404 to everyone,
    # whatever the method (a POST too: not CSRF's 403 page).
    Route("api:index", "GET", "/api/", (200, 200, 200, 200, 200), same=("HEAD", "OPTIONS")),
    Route("api:not-found", "POST", "/api/no-such-route/", (404, 404, 404, 404, 404),
          same=("GET", *NOT_POST)),
]
_A, _J = "/admin/ratejobs/api", "/admin/ratejobs/job"
_C, _E = "/admin/ratejobs/call", "/admin/ratejobs/throttleevent"
_U, _G = "/admin/auth/user", "/admin/auth/group"
_T = "/admin/authtoken/tokenproxy"
_LOGIN = ("login", "login")  # anonymous and user: the admin's login page, for every method
_SUPERUSER_ONLY = (*_LOGIN, 403, 403, 200)
ADMIN = [
    Route("admin:index", "GET", "/admin/", (*_LOGIN, 200, 200, 200), same=ANY),
    Route("admin:app_list", "GET", "/admin/ratejobs/", (*_LOGIN, 200, 200, 200), same=ANY),
    Route("admin:app_list", "GET", "/admin/auth/", (*_LOGIN, 404, 404, 200), same=ANY),
    # the overview lists APIs to every staff member and only their own jobs, its data too
    Route("ratejobs_overview", "GET", "/overview/", (*_LOGIN, 200, 200, 200),
          same=ANY),
    Route("ratejobs_overview_data", "GET", "/overview/data/",
          (*_LOGIN, 200, 200, 200), same=ANY),
    # one's own password, one's own signing key
    Route("admin:password_change", "GET", "/admin/password_change/", (*_LOGIN, 200, 200, 200),
          same=("HEAD", "OPTIONS")),
    Route("admin:password_change", "POST", "/admin/password_change/", (*_LOGIN, 200, 200, 200),
          same=("PUT",)),
    Route("admin:password_change_done", "GET", "/admin/password_change/done/",
          (*_LOGIN, 200, 200, 200), same=("HEAD", "OPTIONS")),
    Route("admin:jsi18n", "GET", "/admin/jsi18n/", (*_LOGIN, 200, 200, 200),
          same=("HEAD", "OPTIONS")),
    # autocomplete lists what the admin's queryset of the related model holds for the person:
    # their own jobs and calls only
    Route("admin:autocomplete", "GET",
          "/admin/autocomplete/?app_label=ratejobs&model_name=call&field_name=job",
          (*_LOGIN, 200, 200, 200), same=("HEAD", "OPTIONS")),
    Route("admin:autocomplete", "GET",
          "/admin/autocomplete/?app_label=ratejobs&model_name=throttleevent&field_name=call",
          (*_LOGIN, 200, 200, 200)),
    # "view on site": no ratejobs model has a public page, so a 404 whether the object exists
    Route("admin:view_on_site", "GET", "/admin/r/{job_ct}/{job}/", (*_LOGIN, 404, 404, 404),
          same=ANY),
    Route("admin:view_on_site", "GET", "/admin/r/{job_ct}/999999999/", (*_LOGIN, 404, 404, 404)),
    # the admin's catch-all: a 404 behind its login
    Route("admin:catch_all", "GET", "/admin/no-such-page/", (*_LOGIN, 404, 404, 404), same=ANY),

    Route("admin:ratejobs_api_changelist", "GET", f"{_A}/", (*_LOGIN, 200, 200, 200),
          same=NOT_POST),
    # deleting an API is a superuser's; one with jobs is protected (the page says why), so
    # the world's API stays
    Route("admin:ratejobs_api_changelist", "POST", f"{_A}/", (*_LOGIN, 200, 200, 200),
          "delete_selected_api"),
    Route("admin:ratejobs_api_add", "GET", f"{_A}/add/", (*_LOGIN, 403, 200, 200),
          same=NOT_POST),
    Route("admin:ratejobs_api_add", "POST", f"{_A}/add/", (*_LOGIN, 403, 302, 302), "api_form"),
    Route("admin:ratejobs_api_change", "GET", f"{_A}/{{api_id}}/change/",
          (*_LOGIN, 200, 200, 200), same=NOT_POST),
    Route("admin:ratejobs_api_change", "POST", f"{_A}/{{api_id}}/change/",
          (*_LOGIN, 403, 302, 302), "api_form", moves_base_url=True),
    # reset and block ask first (a GET shows the confirmation), and only managers get that far
    Route("admin:ratejobs_api_reset", "GET", f"{_A}/{{api_id}}/reset/",
          (*_LOGIN, 403, 200, 200), same=NOT_POST),
    Route("admin:ratejobs_api_reset", "POST", f"{_A}/{{api_id}}/reset/",
          (*_LOGIN, 403, 302, 302), "confirmed"),
    Route("admin:ratejobs_api_block", "GET", f"{_A}/{{api_id}}/block/?seconds=0.5",
          (*_LOGIN, 403, 200, 200), same=NOT_POST),
    Route("admin:ratejobs_api_block", "POST", f"{_A}/{{api_id}}/block/",
          (*_LOGIN, 403, 302, 302), "block"),
    Route("admin:ratejobs_api_credential_save", "POST", f"{_A}/{{api_id}}/credentials/",
          (*_LOGIN, 403, 302, 302), "credential_form"),
    Route("admin:ratejobs_api_credential_delete", "POST", f"{_A}/{{api_id}}/credentials/delete/",
          (*_LOGIN, 403, 302, 302), "credential_form"),
    Route("admin:ratejobs_api_history", "GET", f"{_A}/{{api_id}}/history/",
          (*_LOGIN, 200, 200, 200), same=ANY),
    Route("admin:ratejobs_api_delete", "GET", f"{_A}/{{api_id}}/delete/", _SUPERUSER_ONLY,
          same=NOT_POST),
    Route("admin:ratejobs_api_delete", "POST", f"{_A}/{{api_id}}/delete/", _SUPERUSER_ONLY,
          "confirm"),
    # Django's redirect of an object's bare address to its change page, for every method
    Route("admin:object_redirect", "GET", f"{_A}/{{api_id}}/", (*_LOGIN, 302, 302, 302),
          same=REDIRECT),
    Route("admin:ratejobs_job_changelist", "GET", f"{_J}/", (*_LOGIN, 200, 200, 200),
          same=NOT_POST),
    # the purge action (in place of Django's bulk delete): offered to superusers only; the
    # others get the list back
    Route("admin:ratejobs_job_changelist", "POST", f"{_J}/", (*_LOGIN, 200, 200, 302),
          "purge_selected_jobs"),
    Route("admin:ratejobs_job_add", "GET", f"{_J}/add/", (*_LOGIN, 200, 200, 200),
          same=NOT_POST),
    Route("admin:ratejobs_job_add", "POST", f"{_J}/add/", (*_LOGIN, 302, 302, 302), "job_form"),
    Route("admin:ratejobs_job_change", "GET", f"{_J}/{{job}}/change/",
          (*_LOGIN, "gone", "gone", 200), same=NOT_POST),
    # every field of a job is read-only: a superuser's save changes nothing
    Route("admin:ratejobs_job_change", "POST", f"{_J}/{{job}}/change/",
          (*_LOGIN, "gone", "gone", 302)),
    Route("admin:ratejobs_job_progress", "GET", f"{_J}/{{job}}/progress/",
          (*_LOGIN, 404, 404, 200), same=ANY),
    Route("admin:ratejobs_job_act", "POST", f"{_J}/{{job}}/act/pause/",
          (*_LOGIN, 404, 404, 302)),
    Route("admin:ratejobs_job_act", "GET", f"{_J}/{{job}}/act/cancel/",
          (*_LOGIN, 404, 404, 200), same=NOT_POST),
    Route("admin:ratejobs_job_act", "POST", f"{_J}/{{job}}/act/cancel/",
          (*_LOGIN, 404, 404, 302), "confirmed"),
    Route("admin:ratejobs_job_act", "POST", f"{_J}/{{job}}/act/resume/",
          (*_LOGIN, 404, 404, 302)),
    Route("admin:ratejobs_job_act", "POST", f"{_J}/{{job}}/act/retry-failed/",
          (*_LOGIN, 404, 404, 302)),
    Route("admin:ratejobs_job_clone", "POST", f"{_J}/{{job}}/clone/",
          (*_LOGIN, 404, 404, 302), "clone"),
    Route("admin:ratejobs_job_results", "GET", f"{_J}/{{job}}/results.jsonl",
          (*_LOGIN, 404, 404, 200), same=ANY),
    Route("admin:ratejobs_job_results", "GET", f"{_J}/{{job}}/results.csv",
          (*_LOGIN, 404, 404, 200)),
    Route("admin:ratejobs_job_history", "GET", f"{_J}/{{job}}/history/",
          (*_LOGIN, "gone", "gone", 200), same=ANY),
    Route("admin:ratejobs_job_delete", "GET", f"{_J}/{{job}}/delete/", _SUPERUSER_ONLY,
          same=NOT_POST),
    Route("admin:ratejobs_job_delete", "POST", f"{_J}/{{done_job}}/delete/",
          (*_LOGIN, 403, 403, 302), "confirm"),
    Route("admin:object_redirect", "GET", f"{_J}/{{job}}/", (*_LOGIN, 302, 302, 302),
          same=REDIRECT),
    Route("admin:ratejobs_call_changelist", "GET", f"{_C}/", (*_LOGIN, 200, 200, 200),
          same=NOT_POST),
    # a job's calls are its history: no bulk delete, by anyone; the list comes back
    Route("admin:ratejobs_call_changelist", "POST", f"{_C}/", (*_LOGIN, 200, 200, 200),
          "delete_selected_call"),
    Route("admin:ratejobs_call_add", "GET", f"{_C}/add/", (*_LOGIN, 403, 403, 403), same=ANY),
    Route("admin:ratejobs_call_change", "GET", f"{_C}/{{call}}/change/",
          (*_LOGIN, "gone", "gone", 200), same=NOT_POST),
    Route("admin:ratejobs_call_change", "POST", f"{_C}/{{call}}/change/",
          (*_LOGIN, 403, 403, 403)),
    Route("admin:ratejobs_call_history", "GET", f"{_C}/{{call}}/history/",
          (*_LOGIN, "gone", "gone", 200), same=ANY),
    # nor one at a time: a job's only call deleted left it "1 succeeded, 100 %"
    Route("admin:ratejobs_call_delete", "GET", f"{_C}/{{call}}/delete/",
          (*_LOGIN, 403, 403, 403), same=NOT_POST),
    Route("admin:ratejobs_call_delete", "POST", f"{_C}/{{call}}/delete/",
          (*_LOGIN, 403, 403, 403), "confirm"),
    Route("admin:object_redirect", "GET", f"{_C}/{{call}}/", (*_LOGIN, 302, 302, 302),
          same=REDIRECT),
    Route("admin:ratejobs_signingkey_changelist", "GET", "/admin/ratejobs/signingkey/",
          (*_LOGIN, 200, 200, 200), same=ANY),
    Route("admin:ratejobs_signingkey_rotate", "GET", "/admin/ratejobs/signingkey/rotate/",
          (*_LOGIN, 200, 200, 200), same=NOT_POST),
    Route("admin:ratejobs_signingkey_rotate", "POST", "/admin/ratejobs/signingkey/rotate/",
          (*_LOGIN, 200, 200, 200)),
    Route("admin:ratejobs_throttleevent_changelist", "GET", f"{_E}/",
          (*_LOGIN, 200, 200, 200), same=NOT_POST),
    Route("admin:ratejobs_throttleevent_changelist", "POST", f"{_E}/",
          (*_LOGIN, 200, 200, 200), "delete_selected_event"),
    Route("admin:ratejobs_throttleevent_add", "GET", f"{_E}/add/", (*_LOGIN, 403, 403, 403),
          same=ANY),
    Route("admin:ratejobs_throttleevent_change", "GET", f"{_E}/{{event}}/change/",
          (*_LOGIN, "gone", "gone", 200), same=NOT_POST),
    Route("admin:ratejobs_throttleevent_change", "POST", f"{_E}/{{event}}/change/",
          (*_LOGIN, 403, 403, 403)),
    Route("admin:ratejobs_throttleevent_history", "GET", f"{_E}/{{event}}/history/",
          (*_LOGIN, "gone", "gone", 200), same=ANY),
    Route("admin:ratejobs_throttleevent_delete", "GET", f"{_E}/{{event}}/delete/",
          (*_LOGIN, 403, 403, 403), same=NOT_POST),
    Route("admin:ratejobs_throttleevent_delete", "POST", f"{_E}/{{event}}/delete/",
          (*_LOGIN, 403, 403, 403), "confirm"),
    Route("admin:object_redirect", "GET", f"{_E}/{{event}}/", (*_LOGIN, 302, 302, 302),
          same=REDIRECT),

    # People, groups and tokens: Django's own pages, a superuser's only (no staff member holds
    # the auth or authtoken permissions; managers hold ratejobs.manage_api alone)
    Route("admin:auth_user_changelist", "GET", f"{_U}/", _SUPERUSER_ONLY, same=NOT_POST),
    Route("admin:auth_user_changelist", "POST", f"{_U}/", (*_LOGIN, 403, 403, 302),
          "delete_selected_user", removes=True),
    Route("admin:auth_user_add", "GET", f"{_U}/add/", _SUPERUSER_ONLY, same=NOT_POST),
    Route("admin:auth_user_add", "POST", f"{_U}/add/", (*_LOGIN, 403, 403, 302), "user_form"),
    Route("admin:auth_user_change", "GET", f"{_U}/{{other}}/change/", _SUPERUSER_ONLY,
          same=NOT_POST),
    Route("admin:auth_user_change", "POST", f"{_U}/{{other}}/change/", _SUPERUSER_ONLY),
    Route("admin:auth_user_password_change", "GET", f"{_U}/{{other}}/password/",
          _SUPERUSER_ONLY, same=NOT_POST),
    Route("admin:auth_user_password_change", "POST", f"{_U}/{{other}}/password/",
          (*_LOGIN, 403, 403, 302), "password_form"),
    Route("admin:auth_user_history", "GET", f"{_U}/{{other}}/history/", _SUPERUSER_ONLY,
          same=ANY),
    Route("admin:auth_user_delete", "GET", f"{_U}/{{other}}/delete/", _SUPERUSER_ONLY,
          same=NOT_POST),
    Route("admin:auth_user_delete", "POST", f"{_U}/{{other}}/delete/", (*_LOGIN, 403, 403, 302),
          "confirm", removes=True),
    Route("admin:object_redirect", "GET", f"{_U}/{{other}}/", (*_LOGIN, 302, 302, 302),
          same=REDIRECT),
    Route("admin:auth_group_changelist", "GET", f"{_G}/", _SUPERUSER_ONLY, same=NOT_POST),
    Route("admin:auth_group_changelist", "POST", f"{_G}/", _SUPERUSER_ONLY),
    Route("admin:auth_group_add", "GET", f"{_G}/add/", _SUPERUSER_ONLY, same=NOT_POST),
    Route("admin:auth_group_add", "POST", f"{_G}/add/", (*_LOGIN, 403, 403, 302), "group_form"),
    Route("admin:auth_group_change", "GET", f"{_G}/{{group}}/change/", _SUPERUSER_ONLY,
          same=NOT_POST),
    Route("admin:auth_group_change", "POST", f"{_G}/{{group}}/change/",
          (*_LOGIN, 403, 403, 302), "group_form"),
    Route("admin:auth_group_history", "GET", f"{_G}/{{group}}/history/", _SUPERUSER_ONLY,
          same=ANY),
    Route("admin:auth_group_delete", "GET", f"{_G}/{{group}}/delete/", _SUPERUSER_ONLY,
          same=NOT_POST),
    Route("admin:auth_group_delete", "POST", f"{_G}/{{group}}/delete/", (*_LOGIN, 403, 403, 302),
          "confirm", removes=True),
    Route("admin:object_redirect", "GET", f"{_G}/{{group}}/", (*_LOGIN, 302, 302, 302),
          same=REDIRECT),
    # a token is the other user's REST password
    Route("admin:authtoken_tokenproxy_changelist", "GET", f"{_T}/", _SUPERUSER_ONLY,
          same=NOT_POST),
    Route("admin:authtoken_tokenproxy_changelist", "POST", f"{_T}/", _SUPERUSER_ONLY),
    Route("admin:authtoken_tokenproxy_add", "GET", f"{_T}/add/", _SUPERUSER_ONLY,
          same=NOT_POST),
    Route("admin:authtoken_tokenproxy_add", "POST", f"{_T}/add/", _SUPERUSER_ONLY),
    Route("admin:authtoken_tokenproxy_change", "GET", f"{_T}/{{other}}/change/",
          _SUPERUSER_ONLY, same=NOT_POST),
    Route("admin:authtoken_tokenproxy_change", "POST", f"{_T}/{{other}}/change/",
          _SUPERUSER_ONLY),
    Route("admin:authtoken_tokenproxy_history", "GET", f"{_T}/{{other}}/history/",
          _SUPERUSER_ONLY, same=ANY),
    Route("admin:authtoken_tokenproxy_delete", "GET", f"{_T}/{{other}}/delete/",
          _SUPERUSER_ONLY, same=NOT_POST),
    Route("admin:authtoken_tokenproxy_delete", "POST", f"{_T}/{{other}}/delete/",
          (*_LOGIN, 403, 403, 302), "confirm", removes=True),
    Route("admin:object_redirect", "GET", f"{_T}/{{other}}/", (*_LOGIN, 302, 302, 302),
          same=REDIRECT),
]
# Outside the admin and the REST API, and reached with a browser's session all the same:
# /metrics is for a scraper with its token (closed here: no token is set), whoever is signed in;
# /healthz answers every role alike (test_metrics_and_health_... below says what differs).
SITE = [
    Route("ratejobs_home", "GET", "/", (302, 302, 302, 302, 302), same=("HEAD",)),
    Route("metrics", "GET", "/metrics", (403, 403, 403, 403, 403), same=ANY),
    Route("health", "GET", "/healthz", (200, 200, 200, 200, 200), same=ANY),
]
# fmt: on
PAGES = ADMIN + SITE

# Routes that carry no role, and why; every other route of the URLconf is in the table.
NOT_IN_THE_TABLE = {
    "admin/login/": "the sign-in form: the same page for everyone, and what signs people in",
    "admin/logout/": "signs out whoever sends it: it shows and changes nothing else",
}


@pytest.fixture
def world(make_api, other_user: Any, unique_name: str) -> dict[str, Any]:
    """Another user's job on an API with a credential: two calls and a throttle event; a
    cancelled one of theirs, which may be purged; their REST token; and a group."""
    api = make_api(credential="secret-of-the-api", base_url=BASE_URL)
    job = job_create(
        owner=other_user, api=api, name="theirs", calls=[{"path": "/a"}, {"path": "/b"}]
    )
    done_job = job_cancel(
        job=job_create(owner=other_user, api=api, name="theirs-done", calls=[{"path": "/c"}])
    )
    call = Call.objects.filter(job=job).first()
    Call.objects.filter(pk=call.pk).update(response_body=b"their private response")
    credentials_add(api=api, items=[("acme", "secret-of-the-api-key")])
    event = ThrottleEvent.objects.create(api=api, job=job, call=call, kind="throttled")
    Token.objects.create(user=other_user)
    group = Group.objects.create(name="auditors")
    return {"api": api.name, "api_id": api.pk, "job": job.pk, "call": call.pk,
            "event": event.pk, "unique": unique_name, "api_obj": api,
            "done_job": done_job.pk, "key": "acme", "other": other_user.pk,
            "group": group.pk, "job_ct": ContentType.objects.get_for_model(Job).pk}  # fmt: skip


def payload(name: str, world: dict[str, Any], role: str) -> dict[str, Any]:
    payloads: dict[str, Any] = {
        "": {},
        "new_api": {"name": f"{world['unique']}-{role}", "base_url": "https://x.example",
                    "rate": 1},
        "limits": {"rate": 3, "base_url": OTHER_BASE_URL},
        "new_job": {"api": world["api"], "name": f"mine-{role}", "calls": [{"path": "/x"}]},
        "api_form": {"name": f"{world['unique']}-a-{role}", "base_url": OTHER_BASE_URL,
                     "rate": 2, "period": 1, "burst": 1, "max_concurrency": 0,
                     "max_attempts": 5, "max_throttled_retries": 50, "timeout": 30,
                     "default_headers": "{}", "auth_header": "Authorization",
                     "credential_env": ""},
        "block": {"seconds": "0.5", "post": "yes"},
        "confirmed": {"post": "yes"},  # from a confirmation page (reset, cancel)
        "confirm": {"post": "yes"},  # from a delete page
        "clone": {"calls": "all"},  # run a job again, REST and admin alike
        "new_credential": {"key": f"k-{role}", "secret": "secret-of-the-api-key"},
        "secret": {"secret": "secret-of-the-api-key"},
        "credential_form": {"key": f"k-{role}", "secret": "secret-of-the-api-key"},
        "job_form": {"api": world["api_id"], "name": f"mine-{role}", "priority": 1,
                     "method": "GET", "path_template": "/u/{id}", "values": "1\n2"},
        "purge_selected_jobs": {"action": "purge_selected",
                                "_selected_action": [world["done_job"]], "post": "yes"},
        "delete_selected_api": {"action": "delete_selected",
                                "_selected_action": [world["api_id"]], "post": "yes"},
        "delete_selected_call": {"action": "delete_selected",
                                 "_selected_action": [world["call"]], "post": "yes"},
        "delete_selected_event": {"action": "delete_selected",
                                  "_selected_action": [world["event"]], "post": "yes"},
        "delete_selected_user": {"action": "delete_selected",
                                 "_selected_action": [world["other"]], "post": "yes"},
        "user_form": {"username": f"new-{role}", "usable_password": "true",
                      "password1": "a-Long-password-9", "password2": "a-Long-password-9"},
        "password_form": {"usable_password": "true", "password1": "a-Long-password-9",
                          "password2": "a-Long-password-9"},
        "group_form": {"name": f"group-{role}"},
    }  # fmt: skip
    return payloads[name]  # a KeyError for a name the table misspelt


def answer(response: Any) -> Any:
    if response.status_code == 302:
        location = response.headers["Location"]
        if "/admin/login/" in location:
            return "login"
        if location.rstrip("/") == "/admin":
            return "gone"
    return response.status_code


def body_text(response: Any) -> str:
    """The whole body, streamed (a results file) or not."""
    if response.streaming:
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def people(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {role: None if role == "anonymous" else request.getfixturevalue(role) for role in ROLES}


def rest_client(user: Any) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def rest_request(
    client: APIClient, route: Route, world: dict[str, Any], role: str, method: str = ""
) -> Any:
    path = route.path.format(**world)
    if method:  # one of the row's `same` methods: no body
        return client.generic(method, path)
    if route.data == "jsonl":
        return client.generic(route.method, path, b'{"path": "/x"}\n',
                              content_type="application/x-ndjson")  # fmt: skip
    body = payload(route.data, world, role)
    return getattr(client, route.method.lower())(path, body or None, format="json")


def admin_client(user: Any) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def page_request(
    client: Client, route: Route, world: dict[str, Any], role: str, method: str = ""
) -> Any:
    path = route.path.format(**world)
    if method:  # one of the row's `same` methods: no body
        return client.generic(method, path)
    if route.method == "GET":
        return client.get(path)
    return client.post(path, payload(route.data, world, role))


def delete_target(route: Route, world: dict[str, Any]) -> QuerySet | None:
    """The object a delete row (a delete page's confirmation, or the bulk delete action) is
    about; a job is purged instead (purge_started), and checked as such."""
    if route.data != "confirm" and not route.data.startswith("delete_selected"):
        return None
    targets = {
        _A: Api.objects.filter(pk=world["api_id"]),
        _C: Call.objects.filter(pk=world["call"]),
        _E: ThrottleEvent.objects.filter(pk=world["event"]),
        _U: get_user_model().objects.filter(pk=world["other"]),
        _G: Group.objects.filter(pk=world["group"]),
        _T: Token.objects.filter(user_id=world["other"]),
    }
    return next((found for prefix, found in targets.items() if route.path.startswith(prefix)), None)


def configure_limiters() -> None:
    """What the commits this test's transaction never makes would do: configure the limiter
    of every API made meanwhile (services.apis.api_create, on commit), as make_api does."""
    for api in Api.objects.all():
        api_limiter(api).configure(api.limiter_config())


def base_url_moved(world: dict[str, Any]) -> bool:
    """Whether the world's API left BASE_URL; put back, so that the next role's try shows."""
    moved = (
        Api.objects.filter(pk=world["api_id"]).exclude(base_url=BASE_URL).update(base_url=BASE_URL)
    )
    return bool(moved)


@pytest.mark.parametrize("route", REST, ids=lambda r: f"{r.method} {r.path}")
def test_rest_route_answers_each_role_as_the_table_says(request, route, world):
    answers, moved = [], []
    for role, user in people(request).items():
        client = rest_client(user)
        response = rest_request(client, route, world, role)
        answers.append(answer(response))
        if base_url_moved(world):
            moved.append(role)
        for method in route.same:
            same = rest_request(client, route, world, role, method)
            assert answer(same) == answers[-1], (role, method)
        text = body_text(response)
        if role != "superuser":  # nothing of the other user's job leaks, in a list or not
            assert f'"id":{world["job"]},' not in text, (role, route)
            assert "their private response" not in text, (role, route)
        elif route.name == "api:job-list" and route.method == "GET":
            assert f'"id":{world["job"]},' in text
        assert "secret-of-the-api" not in text
    assert tuple(answers) == route.expected, dict(zip(ROLES, answers, strict=True))
    # a payload that moves base_url moves it for the roles that manage APIs, and only them
    assert moved == (MANAGE_APIS if route.moves_base_url else []), moved


# Pages that list the other user's jobs or calls to the superuser alone (checked for both).
SUPERUSER_SEES_THEIRS = ("ratejobs_overview", "ratejobs_overview_data", "admin:autocomplete")


@pytest.mark.parametrize("route", PAGES, ids=lambda r: f"{r.method} {r.path}")
def test_admin_page_answers_each_role_as_the_table_says(request, route, world):
    answers, moved, kept = [], [], []
    target = delete_target(route, world)
    for role, user in people(request).items():
        client = admin_client(user)
        response = page_request(client, route, world, role)
        answers.append(answer(response))
        if base_url_moved(world):
            moved.append(role)
        if target is not None:
            kept.append(target.exists())
        for method in route.same:
            same = page_request(client, route, world, role, method)
            assert answer(same) == answers[-1], (role, method)
        text = body_text(response)
        if response.status_code == 200 and role != "superuser":
            assert "their private response" not in text and "theirs" not in text, (role, route)
        elif route.name in SUPERUSER_SEES_THEIRS and response.status_code == 200:
            assert "theirs" in text  # so their absence for the others can show a leak
        assert "secret-of-the-api" not in text
    assert tuple(answers) == route.expected, dict(zip(ROLES, answers, strict=True))
    assert moved == (MANAGE_APIS if route.moves_base_url else []), moved
    if target is not None:  # nobody but the superuser removes anything
        assert kept == [True, True, True, True, not route.removes], kept
    if route.data in ("purge_selected_jobs", "confirm") and route.path.startswith(_J):
        # only the superuser, last, could
        assert Job.objects.get(pk=world["done_job"]).purge_started is not None


def test_other_users_objects_stay_as_they_were_for_everyone_but_a_superuser(request, world):
    # given: every route that may change something tried by every role except the superuser,
    # one role after the other; expect: their jobs, calls, events, token and account as they
    # were, and the API's base_url moved by the manager alone
    moved = []
    for role, user in list(people(request).items())[:-1]:
        for route in REST + PAGES:
            if route.method in ("GET", "HEAD", "OPTIONS"):
                continue
            if route in REST:
                rest_request(rest_client(user), route, world, role)
            else:
                page_request(admin_client(user), route, world, role)
            configure_limiters()
        if base_url_moved(world):
            moved.append(role)
    assert moved == ["manager"]
    job = Job.objects.get(pk=world["job"])
    assert job.status == "queued" and job.owner.username == "mallory"
    assert Call.objects.filter(job=job, status="pending").count() == 2
    assert Call.objects.filter(pk=world["call"]).exists()
    assert ThrottleEvent.objects.filter(pk=world["event"]).exists()
    assert Job.objects.get(pk=world["done_job"]).purge_started is None
    assert Token.objects.filter(user_id=world["other"]).exists()
    assert Group.objects.filter(pk=world["group"]).exists()
    api = Api.objects.get(pk=world["api_id"])
    assert api.credential_encrypted and api.base_url == BASE_URL


def _routes(patterns: list[Any], prefix: str = "") -> Iterator[str]:
    """Every route of the URLconf, as ResolverMatch.route writes it (includes joined, a
    nested regex losing its "^")."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern).removeprefix("^" if prefix else "")
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, route)
        else:
            yield route


def test_the_table_covers_every_route_of_the_urlconf_with_every_method_it_answers(request, world):
    rows: dict[str, list[Route]] = defaultdict(list)
    for row in REST + PAGES:
        match = resolve(urlsplit(row.path.format(**world)).path)
        if match.url_name:  # the row's path reaches the route its name says
            assert match.view_name == row.name, (row, match.view_name)
        rows[match.route].append(row)
    routes = set(_routes(get_resolver().url_patterns))
    assert routes - rows.keys() - NOT_IN_THE_TABLE.keys() == set(), "routes missing from the table"
    assert NOT_IN_THE_TABLE.keys() <= routes - rows.keys(), "an exemption no longer needed"
    # given: each method the table has no row for, sent by the superuser (who may do most);
    # expect: a 405, so the route does not answer it
    superuser = request.getfixturevalue("superuser")
    unlisted = []
    for route, its_rows in rows.items():
        listed = {method for row in its_rows for method in (row.method, *row.same)}
        first = its_rows[0]
        client = rest_client(superuser) if first in REST else admin_client(superuser)
        for method in sorted(METHODS - listed):
            response = client.generic(method, first.path.format(**world))
            if response.status_code != 405:
                unlisted.append((route, method, answer(response)))
    assert unlisted == [], "methods these routes answer are missing from the table"


def test_job_submission_never_needs_to_see_other_users_jobs(request, world):
    # given: staff submitting a job in the admin; expect: the job is theirs, made by this
    # request, and their job list holds it and none of the other user's
    user = request.getfixturevalue("staff")
    client = admin_client(user)
    before = timezone.now()
    response = client.post(f"{_J}/add/", payload("job_form", world, "staff"))
    job = Job.objects.get(name="mine-staff")
    assert response.status_code == 302 and response.headers["Location"] == f"{_J}/{job.pk}/change/"
    assert (job.owner, job.api_id, job.total) == (user, world["api_id"], 2)
    assert before <= job.created <= timezone.now()
    listed = client.get(f"{_J}/").content.decode()
    assert "mine-staff" in listed and f"{_J}/{job.pk}/change/" in listed
    assert "theirs" not in listed and f"{_J}/{world['job']}/change/" not in listed


def test_an_api_with_submitter_groups_takes_jobs_from_their_members_and_managers_only(
    client_for, admin_client_for, make_api, user, other_user, staff, manager, tmp_path
):
    from django.contrib.auth.models import Group
    from django.core.management import CommandError, call_command

    billing = Group.objects.create(name="billing")
    other_user.groups.add(billing)
    # given: a manager restricts an API to the billing group through the REST API
    api = make_api()
    restricted = client_for(manager).patch(
        f"/api/apis/{api.name}/", {"submitter_groups": ["billing"]}, format="json"
    )
    assert restricted.status_code == 200 and restricted.json()["submitter_groups"] == ["billing"]
    job = {"api": api.name, "name": "j", "calls": [{"path": "/x"}]}

    refused = client_for(user).post("/api/jobs/", job, format="json")
    assert refused.status_code == 403 and "submitter groups" in refused.json()["detail"]
    assert client_for(other_user).post("/api/jobs/", job, format="json").status_code == 201
    assert client_for(manager).post("/api/jobs/", job, format="json").status_code == 201
    # the admin offers staff only the APIs open to them, and refuses the others
    form = admin_client_for(staff).get("/admin/ratejobs/job/add/").content.decode()
    assert f">{api.name}</option>" not in form
    posted = admin_client_for(staff).post(
        "/admin/ratejobs/job/add/",
        {"api": api.pk, "name": "j", "priority": 1, "method": "GET", "path_template": "/u/{id}",
         "values": "1"},
    )  # fmt: skip
    assert posted.status_code == 200 and "Select a valid choice" in posted.content.decode()
    # and so does the command line
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n')
    with pytest.raises(CommandError, match="submitter groups"):
        call_command(
            "submit_job", "--api", api.name, "--file", str(calls), "--owner", user.username
        )
    assert Job.objects.filter(api=api).count() == 2


def test_an_unknown_submitter_group_is_a_400(client_for, manager, api):
    response = client_for(manager).patch(
        f"/api/apis/{api.name}/", {"submitter_groups": ["nope"]}, format="json"
    )
    assert response.status_code == 400 and "submitter_groups" in response.json()


def test_metrics_and_health_answer_the_same_to_every_role(request, world):
    # /metrics is for a scraper with its token, whoever is signed in; /healthz gives every role
    # the same statuses, and why a part is down only to staff (a driver's message names hosts)
    for role, user in people(request).items():
        assert admin_client(user).get("/metrics").status_code == 403, role
        health = admin_client(user).get("/healthz")
        assert health.status_code == 200, role
        assert health.json()["checks"]["database"]["status"] == "ok", role
        WorkerProcess.objects.all().delete()  # no worker: its part is down, and says why
        workers = admin_client(user).get("/healthz").json()["checks"]["workers"]
        assert workers["status"] == "down", role
        assert ("error" in workers) == bool(user and user.is_staff), role
