"""Issue 9's role table: every REST route and every ratejobs admin page and action, walked as
each role against objects that belong to another user, compared with one table of expected
answers (ratejobs.permissions says why each answer is what it is).

Answers: an HTTP status, or "login" for the admin's redirect to its login page and "gone" for
its redirect away from an object the person may not see. Routes of another user's job, calls
and events are 404 to everyone but a superuser, so their ids stay secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from ratejobs.models import Api, Call, Job, ThrottleEvent, WorkerProcess
from ratejobs.services.credentials import credentials_add
from ratejobs.services.jobs import job_cancel, job_create

ROLES = ("anonymous", "user", "staff", "manager", "superuser")


@dataclass(frozen=True)
class Route:
    name: str  # the URL name, so that a route nobody put in the table fails the coverage test
    method: str
    path: str  # formatted with the objects of `world`
    expected: tuple[Any, ...]  # one answer per role, in ROLES order
    data: str = ""  # name of a payload below


# fmt: off
REST = [
    Route("api:api-list", "GET", "/api/apis/", (401, 200, 200, 200, 200)),
    Route("api:api-list", "POST", "/api/apis/", (401, 403, 403, 201, 201), "new_api"),
    Route("api:api-detail", "GET", "/api/apis/{api}/", (401, 200, 200, 200, 200)),
    Route("api:api-detail", "PATCH", "/api/apis/{api}/", (401, 403, 403, 200, 200), "rate"),
    # customers' credentials are the API's, like its own: managers only, reading included
    Route("api:api-credentials", "GET", "/api/apis/{api}/credentials/",
          (401, 403, 403, 200, 200)),
    Route("api:api-credentials", "POST", "/api/apis/{api}/credentials/",
          (401, 403, 403, 201, 201), "new_credential"),
    Route("api:api-credential-detail", "PUT", "/api/apis/{api}/credentials/{key}/",
          (401, 403, 403, 200, 200), "secret"),
    Route("api:api-credential-detail", "DELETE", "/api/apis/{api}/credentials/no-such-key/",
          (401, 403, 403, 404, 404)),
    Route("api:job-list", "GET", "/api/jobs/", (401, 200, 200, 200, 200)),
    Route("api:job-list", "POST", "/api/jobs/", (401, 201, 201, 201, 201), "new_job"),
    Route("api:job-upload", "POST", "/api/jobs/upload/?api={api}&name=up",
          (401, 201, 201, 201, 201), "jsonl"),
    Route("api:job-detail", "GET", "/api/jobs/{job}/", (401, 404, 404, 404, 200)),
    # purging deletes results for good: superusers only, and only a finished job
    Route("api:job-detail", "DELETE", "/api/jobs/{done_job}/", (401, 404, 404, 404, 202)),
    Route("api:job-detail", "DELETE", "/api/jobs/{job}/", (401, 404, 404, 404, 409)),
    Route("api:job-calls", "GET", "/api/jobs/{job}/calls/", (401, 404, 404, 404, 200)),
    Route("api:job-call-detail", "GET", "/api/jobs/{job}/calls/0/", (401, 404, 404, 404, 200)),
    Route("api:job-events", "GET", "/api/jobs/{job}/events/", (401, 404, 404, 404, 200)),
    Route("api:job-results-jsonl", "GET", "/api/jobs/{job}/results.jsonl",
          (401, 404, 404, 404, 200)),
    Route("api:job-results-csv", "GET", "/api/jobs/{job}/results.csv",
          (401, 404, 404, 404, 200)),
    Route("api:job-pause", "POST", "/api/jobs/{job}/pause/", (401, 404, 404, 404, 200)),
    Route("api:job-resume", "POST", "/api/jobs/{job}/resume/", (401, 404, 404, 404, 409)),
    Route("api:job-cancel", "POST", "/api/jobs/{job}/cancel/", (401, 404, 404, 404, 200)),
    Route("api:job-retry-failed", "POST", "/api/jobs/{job}/retry-failed/",
          (401, 404, 404, 404, 409)),
    # a signing key is always one's own: nobody reaches another's
    Route("api:signing-key", "GET", "/api/signing-key/", (401, 200, 200, 200, 200)),
    Route("api:signing-key", "POST", "/api/signing-key/", (401, 201, 201, 201, 201)),
    # The API's description is public, as any published API's documentation is.
    Route("api:schema", "GET", "/api/schema/", (200, 200, 200, 200, 200)),
    Route("api:docs", "GET", "/api/docs/", (200, 200, 200, 200, 200)),
    # So is the index of links; a path under /api/ that names no route is a 404 to everyone.
    Route("api:index", "GET", "/api/", (200, 200, 200, 200, 200)),
    Route("api:not-found", "POST", "/api/no-such-route/", (404, 404, 404, 404, 404)),
]
_A, _J = "/admin/ratejobs/api", "/admin/ratejobs/job"
_C, _E = "/admin/ratejobs/call", "/admin/ratejobs/throttleevent"
ADMIN = [
    Route("admin:index", "GET", "/admin/", ("login", "login", 200, 200, 200)),
    Route("admin:app_list", "GET", "/admin/ratejobs/", ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_api_changelist", "GET", f"{_A}/", ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_api_add", "GET", f"{_A}/add/", ("login", "login", 403, 200, 200)),
    Route("admin:ratejobs_api_add", "POST", f"{_A}/add/", ("login", "login", 403, 302, 302),
          "api_form"),
    Route("admin:ratejobs_api_change", "GET", f"{_A}/{{api_id}}/change/",
          ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_api_change", "POST", f"{_A}/{{api_id}}/change/",
          ("login", "login", 403, 302, 302), "api_form"),
    # reset and block ask first (a GET shows the confirmation), and only managers get that far
    Route("admin:ratejobs_api_reset", "GET", f"{_A}/{{api_id}}/reset/",
          ("login", "login", 403, 200, 200)),
    Route("admin:ratejobs_api_reset", "POST", f"{_A}/{{api_id}}/reset/",
          ("login", "login", 403, 302, 302), "confirmed"),
    Route("admin:ratejobs_api_block", "GET", f"{_A}/{{api_id}}/block/?seconds=0.5",
          ("login", "login", 403, 200, 200)),
    Route("admin:ratejobs_api_block", "POST", f"{_A}/{{api_id}}/block/",
          ("login", "login", 403, 302, 302), "block"),
    Route("admin:ratejobs_api_credential_save", "POST", f"{_A}/{{api_id}}/credentials/",
          ("login", "login", 403, 302, 302), "credential_form"),
    Route("admin:ratejobs_api_credential_delete", "POST", f"{_A}/{{api_id}}/credentials/delete/",
          ("login", "login", 403, 302, 302), "credential_form"),
    Route("admin:ratejobs_api_history", "GET", f"{_A}/{{api_id}}/history/",
          ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_api_delete", "GET", f"{_A}/{{api_id}}/delete/",
          ("login", "login", 403, 403, 200)),
    Route("admin:ratejobs_job_changelist", "GET", f"{_J}/", ("login", "login", 200, 200, 200)),
    # the purge action (in place of Django's bulk delete): offered to superusers only; the
    # others get the list back
    Route("admin:ratejobs_job_changelist", "POST", f"{_J}/", ("login", "login", 200, 200, 302),
          "purge_selected_jobs"),
    Route("admin:ratejobs_job_add", "GET", f"{_J}/add/", ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_job_add", "POST", f"{_J}/add/", ("login", "login", 302, 302, 302),
          "job_form"),
    Route("admin:ratejobs_job_change", "GET", f"{_J}/{{job}}/change/",
          ("login", "login", "gone", "gone", 200)),
    Route("admin:ratejobs_job_progress", "GET", f"{_J}/{{job}}/progress/",
          ("login", "login", 404, 404, 200)),
    Route("admin:ratejobs_job_act", "POST", f"{_J}/{{job}}/act/pause/",
          ("login", "login", 404, 404, 302)),
    Route("admin:ratejobs_job_act", "GET", f"{_J}/{{job}}/act/cancel/",
          ("login", "login", 404, 404, 200)),
    Route("admin:ratejobs_job_act", "POST", f"{_J}/{{job}}/act/cancel/",
          ("login", "login", 404, 404, 302), "confirmed"),
    Route("admin:ratejobs_job_act", "POST", f"{_J}/{{job}}/act/resume/",
          ("login", "login", 404, 404, 302)),
    Route("admin:ratejobs_job_act", "POST", f"{_J}/{{job}}/act/retry-failed/",
          ("login", "login", 404, 404, 302)),
    Route("admin:ratejobs_job_results", "GET", f"{_J}/{{job}}/results.jsonl",
          ("login", "login", 404, 404, 200)),
    Route("admin:ratejobs_job_results", "GET", f"{_J}/{{job}}/results.csv",
          ("login", "login", 404, 404, 200)),
    Route("admin:ratejobs_job_history", "GET", f"{_J}/{{job}}/history/",
          ("login", "login", "gone", "gone", 200)),
    Route("admin:ratejobs_job_delete", "GET", f"{_J}/{{job}}/delete/",
          ("login", "login", 403, 403, 200)),
    Route("admin:ratejobs_job_delete", "POST", f"{_J}/{{done_job}}/delete/",
          ("login", "login", 403, 403, 302), "confirm"),
    Route("admin:ratejobs_call_changelist", "GET", f"{_C}/", ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_call_add", "GET", f"{_C}/add/", ("login", "login", 403, 403, 403)),
    Route("admin:ratejobs_call_change", "GET", f"{_C}/{{call}}/change/",
          ("login", "login", "gone", "gone", 200)),
    Route("admin:ratejobs_call_history", "GET", f"{_C}/{{call}}/history/",
          ("login", "login", "gone", "gone", 200)),
    Route("admin:ratejobs_call_delete", "GET", f"{_C}/{{call}}/delete/",
          ("login", "login", 403, 403, 200)),
    Route("admin:ratejobs_signingkey_changelist", "GET", "/admin/ratejobs/signingkey/",
          ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_signingkey_rotate", "GET", "/admin/ratejobs/signingkey/rotate/",
          ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_signingkey_rotate", "POST", "/admin/ratejobs/signingkey/rotate/",
          ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_throttleevent_changelist", "GET", f"{_E}/",
          ("login", "login", 200, 200, 200)),
    Route("admin:ratejobs_throttleevent_add", "GET", f"{_E}/add/",
          ("login", "login", 403, 403, 403)),
    Route("admin:ratejobs_throttleevent_change", "GET", f"{_E}/{{event}}/change/",
          ("login", "login", "gone", "gone", 200)),
    Route("admin:ratejobs_throttleevent_history", "GET", f"{_E}/{{event}}/history/",
          ("login", "login", "gone", "gone", 200)),
    Route("admin:ratejobs_throttleevent_delete", "GET", f"{_E}/{{event}}/delete/",
          ("login", "login", 403, 403, 200)),
]
# fmt: on


@pytest.fixture
def world(make_api, other_user: Any, unique_name: str) -> dict[str, Any]:
    """Another user's job on an API with a credential: two calls and a throttle event; and a
    cancelled one of theirs, which may be purged."""
    api = make_api(credential="secret-of-the-api")
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
    return {"api": api.name, "api_id": api.pk, "job": job.pk, "call": call.pk,
            "event": event.pk, "unique": unique_name, "api_obj": api,
            "done_job": done_job.pk, "key": "acme"}  # fmt: skip


def payload(name: str, world: dict[str, Any], role: str) -> dict[str, Any]:
    if name == "new_api":
        return {"name": f"{world['unique']}-{role}", "base_url": "https://x.example", "rate": 1}
    if name == "rate":
        return {"rate": 3}
    if name == "new_job":
        return {"api": world["api"], "name": f"mine-{role}", "calls": [{"path": "/x"}]}
    if name == "api_form":
        return {"name": f"{world['unique']}-a-{role}", "base_url": "https://api.example.com/v1",
                "rate": 2, "period": 1, "burst": 1, "max_concurrency": 0, "max_attempts": 5,
                "max_throttled_retries": 50, "timeout": 30, "default_headers": "{}",
                "auth_header": "Authorization", "credential_env": ""}  # fmt: skip
    if name == "block":
        return {"seconds": "0.5", "post": "yes"}
    if name == "confirmed":  # from a confirmation page (reset, cancel)
        return {"post": "yes"}
    if name == "new_credential":
        return {"key": f"k-{role}", "secret": "secret-of-the-api-key"}
    if name == "secret":
        return {"secret": "secret-of-the-api-key"}
    if name == "credential_form":
        return {"key": f"k-{role}", "secret": "secret-of-the-api-key"}
    if name == "job_form":
        return {"api": world["api_id"], "name": f"mine-{role}", "priority": 1, "method": "GET",
                "path_template": "/u/{id}", "values": "1\n2"}  # fmt: skip
    if name == "purge_selected_jobs":
        return {"action": "purge_selected", "_selected_action": [world["done_job"]], "post": "yes"}
    if name == "confirm":
        return {"post": "yes"}
    return {}


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


def rest_request(client: APIClient, route: Route, world: dict[str, Any], role: str) -> Any:
    path = route.path.format(**world)
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


@pytest.mark.parametrize("route", REST, ids=lambda r: f"{r.method} {r.path}")
def test_rest_route_answers_each_role_as_the_table_says(request, route, world):
    answers = []
    for role, user in people(request).items():
        response = rest_request(rest_client(user), route, world, role)
        answers.append(answer(response))
        text = body_text(response)
        if role != "superuser":  # nothing of the other user's job leaks, in a list or not
            assert f'"id":{world["job"]},' not in text, (role, route)
            assert "their private response" not in text, (role, route)
        elif route.name == "api:job-list" and route.method == "GET":
            assert f'"id":{world["job"]},' in text
        assert "secret-of-the-api" not in text
    assert tuple(answers) == route.expected, dict(zip(ROLES, answers, strict=True))


@pytest.mark.parametrize("route", ADMIN, ids=lambda r: f"{r.method} {r.path}")
def test_admin_page_answers_each_role_as_the_table_says(request, route, world):
    answers = []
    for role, user in people(request).items():
        client = admin_client(user)
        path = route.path.format(**world)
        if route.method == "GET":
            response = client.get(path)
        else:
            response = client.post(path, payload(route.data, world, role))
        answers.append(answer(response))
        if response.status_code == 200 and role != "superuser":
            text = body_text(response)
            assert "their private response" not in text and "theirs" not in text, (role, route)
        assert "secret-of-the-api" not in body_text(response)
    assert tuple(answers) == route.expected, dict(zip(ROLES, answers, strict=True))
    if route.data in ("purge_selected_jobs", "confirm"):  # only the superuser, last, could
        assert Job.objects.get(pk=world["done_job"]).purge_started is not None


def test_other_users_objects_stay_as_they_were_for_everyone_but_a_superuser(request, world):
    # given: every mutating route tried by every role except the superuser
    for route in REST + ADMIN:
        if route.method == "GET":
            continue
        for role, user in list(people(request).items())[:-1]:
            if route in REST:
                rest_request(rest_client(user), route, world, role)
            else:
                admin_client(user).post(
                    route.path.format(**world), payload(route.data, world, role)
                )
    job = Job.objects.get(pk=world["job"])
    assert job.status == "queued" and job.owner.username == "mallory"
    assert Call.objects.filter(job=job, status="pending").count() == 2
    assert Job.objects.get(pk=world["done_job"]).purge_started is None
    api = Api.objects.get(pk=world["api_id"])
    assert api.credential_encrypted and api.base_url == "https://api.example.com/v1"


def _names(patterns: list[Any], prefix: str = "") -> set[str]:
    names = set()
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            space = f"{pattern.namespace}:" if getattr(pattern, "namespace", None) else prefix
            names |= _names(pattern.url_patterns, space)
        elif pattern.name:
            names.add(prefix + pattern.name)
    return names


def test_the_table_covers_every_rest_route_and_every_ratejobs_admin_page():
    rest = {n for n in _names(get_resolver().url_patterns) if n.startswith("api:")}
    ratejobs_admin = {f"admin:{n}" for n in _names(admin.site.get_urls())
                      if n.startswith("ratejobs_")} | {"admin:index", "admin:app_list"}  # fmt: skip
    covered = {route.name for route in REST + ADMIN}
    assert rest - covered == set(), "REST routes missing from the role table"
    assert ratejobs_admin - covered == set(), "admin pages missing from the role table"


def test_job_submission_never_needs_to_see_other_users_jobs(request, world, settings):
    # a user's new job is theirs; the admin's job list of a non-superuser holds only theirs
    user = request.getfixturevalue("staff")
    client = admin_client(user)
    client.post(f"{_J}/add/", payload("job_form", world, "staff"))
    listed = client.get(f"{_J}/").content.decode()
    assert "mine-staff" in listed and "theirs" not in listed
    assert timezone.now()


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
