"""The server holds to what the schema says, found wanting by schemathesis before: JSON types
are not converted, bad page and filter parameters are refused, a replayed Idempotency-Key still
needs a body that could make a job, valid JSON is never a parse error, and every path under
/api/ answers in JSON."""

from __future__ import annotations

import json

import pytest

from ratejobs.models import Job
from tests.rest.test_jobs import counts, job_payload


@pytest.mark.parametrize(
    "field, value",
    [("rate", "10"), ("burst", 2.0), ("adaptive", "yes"), ("adaptive", 1), ("auth_header", 5)],
)
def test_a_value_of_another_json_type_is_400_not_converted(client_for, manager, api, field, value):
    response = client_for(manager).patch(f"/api/apis/{api.name}/", {field: value}, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_a_job_field_of_another_json_type_is_400(api_client, api, user):
    response = api_client.post("/api/jobs/", job_payload(api.name, priority="2"), format="json")
    assert response.status_code == 400 and "priority" in response.json()
    response = api_client.post("/api/jobs/", job_payload(api.name, name=7), format="json")
    assert response.status_code == 400 and "name" in response.json()
    assert counts(user) == (0, 0)


def test_a_base_url_with_spaces_around_it_is_refused_not_trimmed(client_for, manager, api):
    url = f"/api/apis/{api.name}/"
    response = client_for(manager).patch(
        url, {"base_url": " https://api.example.com"}, format="json"
    )
    assert response.status_code == 400 and "base_url" in response.json()


@pytest.mark.parametrize("query", ["page_size=0", "page_size=abc", "page_size=", "page_size=1.5"])
def test_a_page_size_that_is_not_a_whole_number_from_1_is_400(api_client, query):
    response = api_client.get(f"/api/jobs/?{query}")
    assert response.status_code == 400 and "page_size" in response.json()


@pytest.mark.parametrize("query", ["page=abc", "page=", "page=last", "page=0", "page=99"])
def test_a_page_that_is_not_a_page_number_of_the_list_is_404(api_client, query):
    assert api_client.get(f"/api/jobs/?{query}").status_code == 404


def test_an_empty_status_filter_is_400_not_no_filter(api_client, make_job):
    make_job()
    assert api_client.get("/api/jobs/?status=").status_code == 400
    assert api_client.get("/api/jobs/?status=queued").json()["count"] == 1


@pytest.mark.parametrize(
    "again",
    [
        {},
        {"calls": []},
        {"calls": [{"path": "/a", "typo": 1}]},
        {"calls": [{"path": "https://elsewhere.example/"}]},
    ],
)
def test_a_replayed_idempotency_key_with_a_body_that_could_not_make_a_job_is_400(
    api_client, api, user, again
):
    first = api_client.post(
        "/api/jobs/", job_payload(api.name), format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    replay = api_client.post(
        "/api/jobs/", {**job_payload(api.name), **again} if again else None, format="json",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )  # fmt: skip
    assert (first.status_code, replay.status_code) == (201, 400)
    assert counts(user) == (1, 3)


def test_integers_over_64_bits_are_json_and_stored_as_given(api_client, api):
    big = 12848451756576163464478720
    body = json.dumps(job_payload(api.name, [{"path": "/a", "query": {"n": big}, "json": -big}]))
    response = api_client.generic("POST", "/api/jobs/", body, content_type="application/json")
    assert response.status_code == 201, response.json()
    call = Job.objects.get(pk=response.json()["id"]).calls.get()
    assert (call.query, call.json) == ({"n": big}, -big)


def test_an_upload_without_a_body_is_a_job_without_calls_not_a_media_type_error(api_client, api):
    response = api_client.post(f"/api/jobs/upload/?api={api.name}&name=empty")
    assert response.status_code == 400
    assert response.json() == {"calls": ["a job needs at least one call"]}


def test_the_api_root_is_an_index_of_links_for_anyone(client_for):
    response = client_for(None).get("/api/")
    assert response.status_code == 200
    links = response.json()
    assert set(links) == {"schema", "docs", "apis", "jobs"}
    assert links["jobs"] == "http://testserver/api/jobs/"


@pytest.mark.parametrize("method", ["get", "post", "patch", "delete"])
@pytest.mark.parametrize("path", ["/api/nothing/here/", "/api/apis/%0A/"])
def test_a_path_under_api_that_names_no_route_is_a_json_404(client_for, user, method, path):
    response = getattr(client_for(user), method)(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


def test_a_missing_trailing_slash_is_named_in_the_404(client_for, user):
    for path in ("/api/jobs", "/api/jobs/abc/"):
        assert client_for(user).get(path).status_code == 404
    assert "/api/jobs/" in client_for(user).post("/api/jobs").json()["detail"]


@pytest.mark.parametrize("field", ["auth_header", "idempotency_header"])
def test_a_header_name_ending_in_a_newline_is_400(client_for, manager, api, field):
    # given: a pattern ending in `$`, which Python's re also matches before a final newline
    response = client_for(manager).patch(
        f"/api/apis/{api.name}/", {field: "X-Key\n"}, format="json"
    )
    assert response.status_code == 400 and field in response.json()


# NUL characters: PostgreSQL's text and jsonb cannot hold them, nor compare with them (a 500)
NUL = "\x00"


@pytest.mark.parametrize(
    "call",
    [
        {"path": "/a", "body": f"x{NUL}y"},
        {"path": "/a", "json": {"k": [f"x{NUL}"]}},
        {"path": "/a", "json": {f"k{NUL}": 1}},
        {"path": "/a", "query": {"q": NUL}},
    ],
)
def test_a_call_holding_a_nul_character_is_400(api_client, api, user, call):
    response = api_client.post("/api/jobs/", job_payload(api.name, [call]), format="json")
    assert response.status_code == 400
    assert set(response.json()["calls"]["0"]) <= {"body", "json", "query"}
    assert counts(user) == (0, 0)


def test_a_name_with_a_nul_character_is_no_record_s_name(api_client, client_for, manager, api):
    job = api_client.post("/api/jobs/", job_payload(f"a{NUL}"), format="json")
    assert job.status_code == 400 and "api" in job.json()
    url = f"/api/apis/{api.name}/"
    groups = client_for(manager).patch(url, {"submitter_groups": [NUL]}, format="json")
    assert groups.status_code == 400 and "submitter_groups" in groups.json()
