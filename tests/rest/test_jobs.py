"""The /api/jobs/ endpoints: submitting jobs (validated by the services, all or nothing),
reading them, their calls and events, and the pause/resume/cancel/retry-failed actions."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.authtoken.models import Token

from ratejobs.models import Call, Job, ThrottleEvent
from ratejobs.rest.errors import RequestTooLarge
from ratejobs.rest.parsers import LimitedJSONParser


def job_payload(api_name: str, calls: list[dict] | None = None, **fields: object) -> dict:
    calls = (
        calls if calls is not None else [{"method": "GET", "path": f"/items/{i}"} for i in range(3)]
    )
    return {"api": api_name, "name": "enrich", "calls": calls, **fields}


def counts(owner: object) -> tuple[int, int]:
    # by owner: other test runs may share the database and leave rows of their own
    return Job.objects.filter(owner=owner).count(), Call.objects.filter(job__owner=owner).count()


# -- create --------------------------------------------------------------------------------


def test_create_stores_the_job_and_its_calls_in_order(api_client, api, user):
    calls = [
        {"method": "get", "path": "/users/1", "query": {"fields": "name"}},
        {"method": "POST", "path": "users", "json": {"name": "Ada"}, "headers": {"X-Trace": "1"}},
        {"method": "PUT", "path": "/users/2", "body": "plain text"},
    ]
    response = api_client.post(
        "/api/jobs/", job_payload(api.name, calls, priority=3), format="json"
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "queued"
    assert (body["total"], body["priority"], body["api"], body["progress"]) == (3, 3, api.name, 0.0)
    assert set(body) >= {"succeeded", "failed", "cancelled", "throttled", "retries", "created"}
    job = Job.objects.get(pk=body["id"])
    assert job.owner == user
    stored = list(job.calls.order_by("index").values_list("index", "method", "path"))
    assert stored == [(0, "GET", "/users/1"), (1, "POST", "users"), (2, "PUT", "/users/2")]
    # every field as given (JSON ones as JSON, not as text), and the defaults of a new call:
    # on PostgreSQL the rows go in with COPY, not through the model
    given = job.calls.order_by("index").values_list("query", "headers", "json", "body")
    assert list(given) == [
        ({"fields": "name"}, None, None, None),
        (None, {"X-Trace": "1"}, {"name": "Ada"}, None),
        (None, None, None, "plain text"),
    ]
    defaults = job.calls.values_list(
        "status", "attempts", "throttled_count", "claim_token", "error", "response_truncated",
        "dispatched_at", "next_attempt_at", "response_body", "finished",
    ).order_by().distinct()  # fmt: skip
    assert list(defaults) == [("pending", 0, 0, "", "", False, None, None, None, None)]
    assert all(call.created is not None for call in job.calls.all())
    assert api_client.get(f"/api/jobs/{job.pk}/").json() == body


@pytest.mark.parametrize(
    ("bad_call", "field"),
    [
        ({"method": "GET", "path": "http://evil/x"}, "path"),
        ({"method": "GET", "path": "//evil.com/x"}, "path"),
        ({"method": "GET", "path": "../../etc"}, "path"),
        ({"method": "GET", "path": "/a/%2e%2e/%2e%2e/etc"}, "path"),
        ({"method": "FOO", "path": "/x"}, "method"),
        ({"method": "GET", "path": "/x", "headers": {"Authorization": "Bearer mine"}}, "headers"),
        ({"method": "GET", "path": "/x", "headers": {"x-api-key": "mine"}}, "headers"),
        ({"method": "GET", "path": "/x", "headers": {"Host": "evil.com"}}, "headers"),
        ({"method": "POST", "path": "/x", "json": {"a": 1}, "body": "b"}, "body"),
        ({"method": "GET", "path": "/x", "data": "?"}, "fields"),
        ({"method": "GET"}, "path"),
    ],
)
def test_a_bad_call_is_400_naming_its_index_and_field_and_nothing_is_stored(
    api_client, user, make_api, bad_call, field
):
    api = make_api(auth_header="X-Api-Key", credential="k")
    calls = [{"method": "GET", "path": "/fine"}, bad_call, {"method": "GET", "path": "/fine"}]

    response = api_client.post("/api/jobs/", job_payload(api.name, calls), format="json")

    assert response.status_code == 400
    errors = response.json()["calls"]
    assert list(errors) == ["1"], errors
    assert field in errors["1"], errors
    assert counts(user) == (0, 0)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"api": "no-such-api"}, "api"),
        ({"calls": "GET /x"}, "calls"),
        ({"calls": []}, "calls"),
        ({"calls": ["GET /x"]}, "calls"),
        ({"priority": 11}, "priority"),
        ({"priority": 0}, "priority"),
        ({"name": ""}, "name"),
        ({"owner": 1}, "owner"),
    ],
)
def test_bad_job_fields_are_400_and_nothing_is_stored(api_client, user, api, payload, field):
    response = api_client.post("/api/jobs/", {**job_payload(api.name), **payload}, format="json")
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert counts(user) == (0, 0)


def test_more_calls_than_the_maximum_is_400(api_client, user, api, settings):
    settings.RATEJOBS_MAX_CALLS_PER_REQUEST = 3
    calls = [{"method": "GET", "path": f"/{i}"} for i in range(4)]
    response = api_client.post("/api/jobs/", job_payload(api.name, calls), format="json")
    assert response.status_code == 400
    assert "calls" in response.json()
    assert counts(user) == (0, 0)
    calls.pop()
    assert (
        api_client.post("/api/jobs/", job_payload(api.name, calls), format="json").status_code
        == 201
    )


def test_an_oversize_body_is_413_before_parsing(api_client, user, api, settings):
    settings.RATEJOBS_MAX_REQUEST_BYTES = 1000
    calls = [{"method": "GET", "path": f"/items/{i}"} for i in range(100)]
    response = api_client.post("/api/jobs/", job_payload(api.name, calls), format="json")
    assert response.status_code == 413
    assert "1000 bytes" in response.json()["detail"]
    assert counts(user) == (0, 0)


def test_a_body_over_djangos_default_upload_cap_is_accepted(api_client, api, settings):
    # given: 3 MiB of JSON, over Django's default 2.5 MiB DATA_UPLOAD_MAX_MEMORY_SIZE;
    # expect: our limit decides (64 MiB by default), and Django's does not refuse first.
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE >= settings.RATEJOBS_MAX_REQUEST_BYTES
    text = "x" * (768 * 1024)
    calls = [{"method": "POST", "path": f"/{i}", "body": text} for i in range(4)]
    response = api_client.post("/api/jobs/", job_payload(api.name, calls), format="json")
    assert response.status_code == 201, response.content[:300]


@pytest.mark.parametrize("declared", [None, "0", "10"])
def test_the_parser_counts_the_real_size_whatever_content_length_says(settings, declared):
    settings.RATEJOBS_MAX_REQUEST_BYTES = 100
    meta = {} if declared is None else {"CONTENT_LENGTH": declared}
    context = {"request": SimpleNamespace(META=meta)}
    parser = LimitedJSONParser()
    with pytest.raises(RequestTooLarge):
        parser.parse(io.BytesIO(b'{"a": "' + b"x" * 200 + b'"}'), "application/json", context)
    assert parser.parse(io.BytesIO(b'{"a": 1}'), "application/json", context) == {"a": 1}


def test_an_idempotency_key_replay_returns_the_same_job_once(
    api_client, client_for, user, other_user, api
):
    payload = job_payload(api.name)
    first = api_client.post("/api/jobs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="order-42")
    again = api_client.post("/api/jobs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="order-42")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert counts(user) == (1, 3)
    # keys belong to their user: the same key from someone else is a new job
    theirs = client_for(other_user).post(
        "/api/jobs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="order-42"
    )
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
    assert counts(other_user) == (1, 3)


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_retry_running_at_once_with_the_first_gets_its_job_with_200(
    client_for, user, make_api, settings
):
    # given an owner allowed one unfinished job, and a first request with key "order-7"
    # that has stored its job but not committed yet
    import threading

    from django.db import connection, transaction

    from ratejobs.services.jobs import job_create

    settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER = 1
    api = make_api()
    stored, commit = threading.Event(), threading.Event()
    made: dict[str, Job] = {}

    def first_request() -> None:
        try:
            with transaction.atomic():
                made["job"] = job_create(
                    owner=user, api=api, name="first", calls=[{"path": "/x"}],
                    idempotency_key="order-7",
                )  # fmt: skip
                stored.set()
                commit.wait(10)
        finally:
            connection.close()

    first = threading.Thread(target=first_request)
    first.start()
    assert stored.wait(10)
    answers = []

    def retry() -> None:
        try:
            answers.append(
                client_for(user).post(
                    "/api/jobs/",
                    job_payload(api.name),
                    format="json",
                    HTTP_IDEMPOTENCY_KEY="order-7",
                )  # fmt: skip
            )
        finally:
            connection.close()

    second = threading.Thread(target=retry)
    second.start()
    second.join(1.0)  # it waits for the first: the key is not committed yet
    commit.set()
    first.join(30)
    second.join(30)
    # expect: the retry gets the first's job as a replay: not a second job, not a 400 for
    # the limit the first job reached, not a 201
    [answer] = answers
    assert answer.status_code == 200, answer.json()
    assert answer.json()["id"] == made["job"].pk
    assert Job.objects.filter(owner=user).count() == 1


def test_a_malformed_idempotency_key_is_400(api_client, user, api):
    response = api_client.post(
        "/api/jobs/", job_payload(api.name), format="json", HTTP_IDEMPOTENCY_KEY="k" * 201
    )
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()
    assert counts(user) == (0, 0)


# -- read ----------------------------------------------------------------------------------


def test_someone_elses_job_is_404_everywhere(client_for, other_user, make_job):
    job = make_job()
    mallory = client_for(other_user)
    paths = ["", "calls/", "events/"]
    actions = ["pause/", "resume/", "cancel/", "retry-failed/"]
    for path in paths:
        assert mallory.get(f"/api/jobs/{job.pk}/{path}").status_code == 404, path
    for action in actions:
        assert mallory.post(f"/api/jobs/{job.pk}/{action}").status_code == 404, action
    assert mallory.get("/api/jobs/").json()["count"] == 0
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED


def test_superusers_see_and_act_on_every_job(client_for, superuser, other_user, make_job):
    mine, theirs = make_job(), make_job(owner=other_user)
    root_client = client_for(superuser)
    listed = {j["id"] for j in root_client.get("/api/jobs/").json()["results"]}
    assert {mine.pk, theirs.pk} <= listed
    assert root_client.get(f"/api/jobs/{theirs.pk}/calls/").status_code == 200
    assert root_client.post(f"/api/jobs/{theirs.pk}/pause/").json()["status"] == "paused"


def test_staff_who_are_not_superusers_neither_see_nor_touch_others_jobs(
    client_for, staff, manager, other_user, make_job
):
    # given: the REST API and the admin follow one policy (ratejobs.permissions)
    theirs = make_job(owner=other_user)
    for person in (staff, manager):
        client = client_for(person)
        listed = {j["id"] for j in client.get("/api/jobs/").json()["results"]}
        assert theirs.pk not in listed
        assert client.get(f"/api/jobs/{theirs.pk}/calls/").status_code == 404
        assert client.post(f"/api/jobs/{theirs.pk}/cancel/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == "queued"


def test_jobs_are_listed_newest_first_and_filter_by_status(api_client, make_job):
    first, second, third = make_job(), make_job(), make_job()
    Job.objects.filter(pk=second.pk).update(status=Job.Status.PAUSED)

    everything = api_client.get("/api/jobs/").json()
    paused = api_client.get("/api/jobs/?status=paused").json()

    assert [j["id"] for j in everything["results"]] == [third.pk, second.pk, first.pk]
    assert [j["id"] for j in paused["results"]] == [second.pk]
    assert api_client.get("/api/jobs/?status=sleeping").status_code == 400


def test_calls_are_paginated_in_index_order_and_filter_by_status(api_client, make_job):
    job = make_job(calls=250)
    job.calls.filter(index__in=[5, 150]).update(status=Call.Status.FAILED)

    page1 = api_client.get(f"/api/jobs/{job.pk}/calls/").json()
    page3 = api_client.get(f"/api/jobs/{job.pk}/calls/?page=3").json()
    big = api_client.get(f"/api/jobs/{job.pk}/calls/?page_size=1000").json()
    failed = api_client.get(f"/api/jobs/{job.pk}/calls/?status=failed").json()

    assert page1["count"] == 250 and len(page1["results"]) == 100 and page1["next"]
    assert [c["index"] for c in page1["results"]] == list(range(100))
    assert [c["index"] for c in page3["results"]] == list(range(200, 250))
    assert page3["next"] is None
    assert len(big["results"]) == 250
    assert [c["index"] for c in failed["results"]] == [5, 150]
    assert api_client.get(f"/api/jobs/{job.pk}/calls/?status=bogus").status_code == 400


def test_page_size_is_capped_at_1000(api_client, make_job):
    job = make_job(calls=1001)
    body = api_client.get(f"/api/jobs/{job.pk}/calls/?page_size=5000").json()
    assert len(body["results"]) == 1000 and body["count"] == 1001


def test_a_call_shows_its_own_headers_and_its_response_body(api_client, make_job):
    job = make_job(calls=3)
    calls = list(job.calls.order_by("index"))
    calls[0].headers = {"X-Trace": "abc"}
    calls[0].response_body = '{"name": "Zoë"}'.encode()
    calls[1].response_body = b"\x89PNG\r\n\x1a\n\xff"
    calls[2].response_body, calls[2].response_truncated = "ab€".encode()[:-1], True
    now = timezone.now()
    for call in calls:
        call.status, call.status_code, call.attempts, call.finished = "succeeded", 200, 1, now
        call.save()

    results = api_client.get(f"/api/jobs/{job.pk}/calls/").json()["results"]

    assert results[0]["headers"] == {"X-Trace": "abc"}
    assert (results[0]["response_body"], results[0]["response_body_base64"]) == (
        '{"name": "Zoë"}',
        False,
    )
    assert results[1]["response_body_base64"] is True
    assert base64.b64decode(results[1]["response_body"]) == b"\x89PNG\r\n\x1a\n\xff"
    assert (results[2]["response_body"], results[2]["response_truncated"]) == ("ab", True)
    assert "api-secret-credential" not in str(results)
    assert {
        "attempts",
        "throttled_count",
        "next_attempt_at",
        "status_code",
        "error",
        "duration",
        "started",
        "finished",
        "query",
        "method",
        "path",
        "id",
    } <= set(results[0])


def test_events_lists_the_jobs_throttle_events_only(api_client, api, make_job):
    job, other = make_job(), make_job()
    call = job.calls.first()
    ThrottleEvent.objects.create(
        api=api, job=job, call=call, kind="throttled", status_code=429, retry_after=2.0
    )
    ThrottleEvent.objects.create(
        api=api, job=job, kind="rate_decreased", rate_before=10, rate_after=7
    )
    ThrottleEvent.objects.create(api=api, job=other, kind="throttled", status_code=429)

    results = api_client.get(f"/api/jobs/{job.pk}/events/").json()["results"]

    assert [e["kind"] for e in results] == ["rate_decreased", "throttled"]
    assert results[1]["status_code"] == 429 and results[1]["retry_after"] == 2.0
    assert results[1]["call"] == call.pk
    assert (results[0]["rate_before"], results[0]["rate_after"]) == (10, 7)


# -- actions -------------------------------------------------------------------------------


def test_pause_and_resume(api_client, make_job):
    job = make_job()
    url = f"/api/jobs/{job.pk}/"

    assert api_client.post(url + "resume/").status_code == 409  # queued: nothing to resume
    paused = api_client.post(url + "pause/")
    assert (paused.status_code, paused.json()["status"]) == (200, "paused")
    again = api_client.post(url + "pause/")
    assert (again.status_code, again.json()["status"]) == (409, "paused")
    assert "pause" in again.json()["detail"]
    resumed = api_client.post(url + "resume/")
    assert (resumed.status_code, resumed.json()["status"]) == (200, "running")
    running = api_client.post(url + "resume/")
    assert running.status_code == 409 and "only paused" in running.json()["detail"]


def test_cancel_cancels_pending_calls(api_client, make_job):
    job = make_job(calls=4)
    job.calls.filter(index=0).update(status=Call.Status.SUCCEEDED)
    Job.objects.filter(pk=job.pk).update(succeeded=1, status=Job.Status.RUNNING)

    response = api_client.post(f"/api/jobs/{job.pk}/cancel/")

    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["cancelled"], body["succeeded"], body["progress"]) == (
        "cancelled",
        3,
        1,
        1.0,
    )
    assert job.calls.filter(status=Call.Status.CANCELLED).count() == 3
    assert api_client.post(f"/api/jobs/{job.pk}/cancel/").status_code == 409
    assert api_client.post(f"/api/jobs/{job.pk}/pause/").status_code == 409
    assert api_client.post(f"/api/jobs/{job.pk}/retry-failed/").status_code == 409


def test_retry_failed_puts_failed_calls_back(api_client, make_job):
    job = make_job(calls=2)
    assert api_client.post(f"/api/jobs/{job.pk}/retry-failed/").status_code == 409  # none failed
    job.calls.filter(index=0).update(status=Call.Status.SUCCEEDED)
    job.calls.filter(index=1).update(status=Call.Status.FAILED, attempts=5, error="HTTP 500")
    Job.objects.filter(pk=job.pk).update(
        succeeded=1, failed=1, status=Job.Status.COMPLETED, finished=timezone.now()
    )

    response = api_client.post(f"/api/jobs/{job.pk}/retry-failed/")

    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["failed"], body["finished"]) == ("running", 0, None)
    retried = job.calls.get(index=1)
    assert (retried.status, retried.attempts, retried.error) == ("pending", 0, "")


# -- auth ----------------------------------------------------------------------------------


def test_token_and_session_auth_work(client_for, user, make_job):
    from rest_framework.test import APIClient

    job = make_job()
    call_command("drf_create_token", user.username, stdout=io.StringIO())
    token = Token.objects.get(user=user)
    by_token = APIClient()
    by_token.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert by_token.get(f"/api/jobs/{job.pk}/").json()["id"] == job.pk

    by_session = APIClient()
    assert by_session.login(username="alice", password="alice-password")
    assert by_session.get(f"/api/jobs/{job.pk}/").status_code == 200


def test_a_calls_header_replaces_the_apis_default_of_the_same_name_whatever_its_case(
    api_client, make_api
):
    # given an API that sends Accept: application/json by default
    from ratejobs.services.calls import call_request

    api = make_api(default_headers={"Accept": "application/json", "X-Team": "data"})
    calls = [{"method": "GET", "path": "/report", "headers": {"accept": "text/csv"}}]
    response = api_client.post("/api/jobs/", job_payload(api.name, calls), format="json")
    # expect: accepted, and sent with the call's value once (sent with both, every call of the
    # job would fail at run time with "header given twice")
    assert response.status_code == 201, response.json()
    call = Job.objects.get(pk=response.json()["id"]).calls.get()
    headers = call_request(call, api, None).headers
    assert [v for k, v in headers.items() if k.lower() == "accept"] == ["text/csv"]
    assert headers["X-Team"] == "data"
