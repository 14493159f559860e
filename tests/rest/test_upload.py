"""POST /api/jobs/upload/: a job's calls as JSON lines, read from the request line by line and
stored in batches, with errors by line and nothing stored on error; its memory does not grow
with the number of lines (measured on a real gunicorn worker)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
from rest_framework.authtoken.models import Token

from ratejobs.models import Call, Job
from tests.rest.realserver import MIB, post_raw

NDJSON = "application/x-ndjson"
# What one upload may add to the web process's peak memory, however many lines it has: the
# line numbers kept for error messages (8 bytes a line) and a batch of calls.
MAX_UPLOAD_GROWTH = 32 * MIB


def upload(client: Any, api_name: str, body: bytes, **headers: Any) -> Any:
    return client.generic(
        "POST", f"/api/jobs/upload/?api={api_name}&name=uploaded", body, content_type=NDJSON,
        **headers,
    )  # fmt: skip


def jsonl(count: int, start: int = 0) -> bytes:
    return b"".join(b'{"path": "/items/%d"}\n' % i for i in range(start, start + count))


def jobs_of(owner: Any) -> tuple[int, int]:
    return Job.objects.filter(owner=owner).count(), Call.objects.filter(job__owner=owner).count()


def test_an_upload_stores_its_lines_as_calls_in_order(api_client, api, user):
    body = b'{"path": "/a"}\n\n{"method": "POST", "path": "/b", "json": {"x": 1}}\n{"path": "/c"}'
    response = api_client.generic(
        "POST", f"/api/jobs/upload/?api={api.name}&name=three&priority=3", body,
        content_type=NDJSON,
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.name, job.priority, job.total, job.owner) == ("three", 3, 3, user)
    calls = list(job.calls.order_by("index").values_list("index", "method", "path", "json"))
    assert calls == [(0, "GET", "/a", None), (1, "POST", "/b", {"x": 1}), (2, "GET", "/c", None)]


def test_bad_lines_are_named_by_line_and_nothing_is_stored(api_client, api, user):
    # given: a blank line 2, so call 2 is on line 4
    bad_call = b'{"path": "/a"}\n\n{"path": "/b"}\n{"path": ""}\n{"path": "/e"}\n'
    response = upload(api_client, api.name, bad_call)
    assert response.status_code == 400
    assert list(response.json()["lines"]) == ["4"]
    assert "path" in response.json()["lines"]["4"]

    not_json = b'{"path": "/a"}\n{"path": \n'
    response = upload(api_client, api.name, not_json)
    assert response.status_code == 400
    message = response.json()["lines"]["2"]["non_field_errors"][0]
    assert message.startswith("not valid JSON")
    assert jobs_of(user) == (0, 0)


def test_every_bad_line_is_named_with_the_count_of_errors(api_client, api, user):
    # given a line that is not JSON, a path that climbs out and a method that is none
    body = b'{oops\n{"path": "/a"}\n{"path": "/../x"}\n\n{"path": "/c", "method": "BREW"}\n'
    response = upload(api_client, api.name, body)
    assert response.status_code == 400
    reply = response.json()
    assert list(reply["lines"]) == ["1", "3", "5"]
    assert reply["lines"]["1"]["non_field_errors"][0].startswith("not valid JSON")
    assert "path" in reply["lines"]["3"] and "method" in reply["lines"]["5"]
    assert reply["error_count"] == {"total": 3, "exact": True}
    # past 20 errors, the first 20 by line and the count of them all
    body = b"".join(b'{"path": "/../%d"}\n' % i for i in range(25))
    reply = upload(api_client, api.name, body).json()
    assert (len(reply["lines"]), reply["error_count"]) == (20, {"total": 25, "exact": True})
    assert jobs_of(user) == (0, 0)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"api": None}, "api"),
        ({"api": "no-such-api"}, "api"),
        ({"name": ""}, "name"),
        ({"priority": "11"}, "priority"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_parameters_are_400_and_the_body_is_not_read(api_client, api, user, params, field):
    query = {"api": api.name, "name": "job", **params}
    query_string = "&".join(f"{k}={v}" for k, v in query.items() if v is not None)
    response = api_client.generic(
        "POST", f"/api/jobs/upload/?{query_string}", jsonl(3), content_type=NDJSON
    )
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert jobs_of(user) == (0, 0)


def test_another_content_type_is_415(api_client, api):
    response = api_client.generic(
        "POST", f"/api/jobs/upload/?api={api.name}&name=x", jsonl(2), content_type="text/csv"
    )
    assert response.status_code == 415


def test_an_idempotency_key_replay_returns_the_first_job_without_reading_the_body(
    api_client, api, user
):
    first = upload(api_client, api.name, jsonl(3), HTTP_IDEMPOTENCY_KEY="upload-1")
    again = upload(api_client, api.name, b"not json at all", HTTP_IDEMPOTENCY_KEY="upload-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert jobs_of(user) == (1, 3)
    assert upload(api_client, api.name, jsonl(1), HTTP_IDEMPOTENCY_KEY="a b").status_code == 400


def test_more_lines_than_an_upload_may_have_is_400_and_nothing_is_stored(
    api_client, api, user, settings
):
    settings.RATEJOBS_MAX_CALLS_PER_UPLOAD = 5
    response = upload(api_client, api.name, jsonl(6))
    assert response.status_code == 400
    assert response.json() == {"calls": ["at most 5 calls per job"]}
    assert jobs_of(user) == (0, 0)
    assert upload(api_client, api.name, jsonl(5)).status_code == 201


def test_an_upload_may_hold_more_calls_than_a_json_job(api_client, api, settings):
    settings.RATEJOBS_MAX_CALLS_PER_REQUEST = 3
    response = upload(api_client, api.name, jsonl(10))
    assert response.status_code == 201
    assert response.json()["total"] == 10


def test_the_schema_documents_the_upload(client_for):
    schema = client_for(None).get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/jobs/upload/"]["post"]
    assert list(operation["requestBody"]["content"]) == [NDJSON]
    names = {parameter["name"] for parameter in operation["parameters"]}
    assert {"api", "name", "priority", "Idempotency-Key"} <= names
    assert {"201", "200", "400", "413", "415", "429"} <= set(operation["responses"])


# -- a real server ---------------------------------------------------------------------------


UPLOAD_LINES = (2_000, 20_000)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_lines_are_stored_with_memory_that_does_not_grow_with_them(
    web_server, django_user_model, make_api
):
    person = django_user_model.objects.create_user("uploader", password="uploader-password")
    token = Token.objects.create(user=person).key
    api_name = make_api().name
    server = web_server()
    headers = {"Authorization": f"Token {token}", "Content-Type": NDJSON}
    url = f"{server.url}/api/jobs/upload/?api={api_name}&name="

    # warm up with a small upload, then ten times more lines, and ten times more again: the
    # peak must not follow (200,000 lines take about 100 s here; the suite stays short)
    warm = requests.post(url + "warm", jsonl(300), headers=headers, timeout=600)
    assert warm.status_code == 201
    before = server.peak_rss()
    figures = []
    for lines in UPLOAD_LINES:
        body = jsonl(lines)
        started = time.perf_counter()
        response = requests.post(url + f"n{lines}", body, headers=headers, timeout=600)
        elapsed = time.perf_counter() - started
        assert response.status_code == 201, response.text[:500]
        assert response.json()["total"] == lines
        growth = server.peak_rss() - before
        figures.append(growth)
        print(
            f"\n{lines} lines ({len(body) / MIB:.1f} MiB) uploaded in {elapsed:.1f} s; peak RSS "
            f"of the worker grew {growth / MIB:.1f} MiB"
        )
    assert Call.objects.filter(job__name=f"n{UPLOAD_LINES[-1]}").count() == UPLOAD_LINES[-1]
    assert figures[-1] < MAX_UPLOAD_GROWTH

    # chunked (no Content-Length) works the same, read as it comes
    chunked = post_raw(server.url, url.removeprefix(server.url) + "chunked", headers,
                       jsonl(5000), chunked=True)  # fmt: skip
    assert chunked.status == 201, chunked.body[:300]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_chunked_upload_over_its_limit_is_413_and_nothing_is_stored(
    web_server, django_user_model, make_api
):
    person = django_user_model.objects.create_user("uploader", password="uploader-password")
    token = Token.objects.create(user=person).key
    api_name = make_api().name
    # a small limit: a chunked body is stored line by line until it passes the limit
    server = web_server(RATEJOBS_MAX_UPLOAD_BYTES=str(64 * 1024))
    headers = {"Authorization": f"Token {token}", "Content-Type": NDJSON}
    path = f"/api/jobs/upload/?api={api_name}&name=over"
    body = jsonl(10_000)  # about 230 KiB
    for chunked in (False, True):
        response = post_raw(server.url, path, headers, body, chunked=chunked)
        assert response.status == 413, response.body[:300]
        assert b"RATEJOBS_MAX_UPLOAD_BYTES" in response.body
    assert jobs_of(person) == (0, 0)
