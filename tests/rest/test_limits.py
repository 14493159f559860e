"""Per-user limits on job creation: a rate (429 with Retry-After, counted in Redis so every web
process shares it), unfinished jobs and calls not yet final (400s naming the setting), the last
two enforced by the job service so the admin and the command line get them too."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework.authtoken.models import Token

from devtools.devredis import free_port
from ratejobs.models import Call, Job
from ratejobs.services.jobs import job_create
from tests.rest.realserver import post_raw


def create(client: Any, api_name: str, calls: int = 1) -> Any:
    payload = {
        "api": api_name,
        "name": "limited",
        "calls": [{"path": f"/items/{i}"} for i in range(calls)],
    }
    return client.post("/api/jobs/", payload, format="json")


def upload(client: Any, api_name: str, calls: int = 1) -> Any:
    body = b"".join(b'{"path": "/items/%d"}\n' % i for i in range(calls))
    return client.generic(
        "POST", f"/api/jobs/upload/?api={api_name}&name=up", body,
        content_type="application/x-ndjson",
    )  # fmt: skip


def test_creating_jobs_faster_than_the_rate_is_429_with_retry_after(api_client, api, settings):
    settings.RATEJOBS_JOB_CREATE_RATE = "2/min"
    assert create(api_client, api.name).status_code == 201
    assert upload(api_client, api.name).status_code == 201  # one count for both ways in
    for refused in (create(api_client, api.name), upload(api_client, api.name)):
        assert refused.status_code == 429
        assert 0 < int(refused["Retry-After"]) <= 60
        assert "the limit is 2/min per user (RATEJOBS_JOB_CREATE_RATE)" in refused.json()["detail"]
    assert api_client.get("/api/jobs/").status_code == 200  # reading is not creating


def test_the_rate_is_per_user(client_for, user, other_user, api, settings):
    settings.RATEJOBS_JOB_CREATE_RATE = "1/min"
    assert create(client_for(user), api.name).status_code == 201
    assert create(client_for(user), api.name).status_code == 429
    assert create(client_for(other_user), api.name).status_code == 201


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_rate_holds_across_web_processes(web_server, django_user_model, make_api):
    # given: two gunicorn workers; expect: 3 jobs a minute in all, whichever worker answers
    person = django_user_model.objects.create_user("hasty", password="hasty-password")
    token = Token.objects.create(user=person).key
    api_name = make_api().name
    server = web_server(workers=2, RATEJOBS_JOB_CREATE_RATE="3/min")
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    body = b'{"api": "%s", "name": "n", "calls": [{"path": "/a"}]}' % api_name.encode()
    statuses = [post_raw(server.url, "/api/jobs/", headers, body).status for _ in range(8)]
    assert sorted(statuses) == [201] * 3 + [429] * 5
    assert Job.objects.filter(owner=person).count() == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_with_the_cache_down_jobs_are_taken_uncounted_and_the_caps_still_hold(
    web_server, django_user_model, make_api
):
    # given: the web server's cache on a port nobody listens on (its Redis restarting)
    person = django_user_model.objects.create_user("patient", password="patient-password")
    token = Token.objects.create(user=person).key
    api_name = make_api().name
    server = web_server(
        RATEJOBS_CACHE_URL=f"redis://127.0.0.1:{free_port()}/0",
        RATEJOBS_JOB_CREATE_RATE="1/min",
        RATEJOBS_MAX_ACTIVE_JOBS_PER_USER="2",
    )
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    body = b'{"api": "%s", "name": "n", "calls": [{"path": "/a"}]}' % api_name.encode()
    answers = [post_raw(server.url, "/api/jobs/", headers, body) for _ in range(3)]
    # expect: stored for later (not a 500), the rate not counted, the database's cap enforced
    assert [answer.status for answer in answers] == [201, 201, 400]
    assert b"RATEJOBS_MAX_ACTIVE_JOBS_PER_USER" in answers[2].body
    assert Job.objects.filter(owner=person).count() == 2
    assert "the cache failed, not counting" in server.log.read_text()


def test_unfinished_jobs_per_user_are_limited(api_client, api, user, settings):
    settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER = 2
    first, second = create(api_client, api.name).json(), create(api_client, api.name).json()
    api_client.post(f"/api/jobs/{second['id']}/pause/")  # paused is still unfinished

    refused = create(api_client, api.name)
    assert refused.status_code == 400
    (message,) = refused.json()["non_field_errors"]
    assert "2 per user (RATEJOBS_MAX_ACTIVE_JOBS_PER_USER)" in message
    assert upload(api_client, api.name).status_code == 400
    assert Job.objects.filter(owner=user).count() == 2

    api_client.post(f"/api/jobs/{first['id']}/cancel/")
    assert create(api_client, api.name).status_code == 201


def test_superusers_are_limited_like_everyone(client_for, superuser, api, settings):
    # the limits protect the machine; a superuser who needs more raises the setting
    settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER = 1
    assert create(client_for(superuser), api.name).status_code == 201
    assert create(client_for(superuser), api.name).status_code == 400


def test_calls_not_yet_final_per_user_are_limited(api_client, api, user, settings):
    settings.RATEJOBS_MAX_PENDING_CALLS_PER_USER = 5
    first = create(api_client, api.name, calls=3).json()

    refused = create(api_client, api.name, calls=3)
    assert refused.status_code == 400
    (message,) = refused.json()["calls"]
    assert "already hold 3 calls" in message
    assert "5 per user (RATEJOBS_MAX_PENDING_CALLS_PER_USER)" in message
    assert "at most 2 calls" in message
    assert upload(api_client, api.name, calls=3).status_code == 400
    assert Call.objects.filter(job__owner=user).count() == 3  # nothing of the refused jobs

    assert create(api_client, api.name, calls=2).status_code == 201
    # finished calls no longer count (the job's counters move with its calls)
    Job.objects.filter(pk=first["id"]).update(succeeded=2)
    assert create(api_client, api.name, calls=2).status_code == 201


def test_the_service_enforces_the_limits_for_the_admin_and_the_command_line(api, user, settings):
    settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER = 1
    job_create(owner=user, api=api, name="first", calls=[{"path": "/a"}])
    with pytest.raises(ValidationError, match="RATEJOBS_MAX_ACTIVE_JOBS_PER_USER"):
        job_create(owner=user, api=api, name="second", calls=[{"path": "/a"}])

    settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER = 10
    settings.RATEJOBS_MAX_PENDING_CALLS_PER_USER = 3
    with pytest.raises(ValidationError, match="RATEJOBS_MAX_PENDING_CALLS_PER_USER"):
        job_create(owner=user, api=api, name="third", calls=({"path": "/b"} for _ in range(3)))
    assert Job.objects.filter(owner=user).count() == 1


def test_the_defaults_let_the_benchmark_and_the_demo_run(settings):
    # bench/jobs.py submits 10,000 calls in one job; the demo one job per run
    assert settings.RATEJOBS_MAX_CALLS_PER_REQUEST >= 10_000
    assert settings.RATEJOBS_MAX_PENDING_CALLS_PER_USER >= settings.RATEJOBS_MAX_CALLS_PER_UPLOAD
    assert settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER >= 10
