"""`GET /api/jobs/{id}/results.jsonl` and `.csv`: every call of a job in index order, bodies as
the call pages give them, streamed from a cursor; another user's job is a 404."""

from __future__ import annotations

import base64
import csv
import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.http import StreamingHttpResponse
from django.test.utils import CaptureQueriesContext

from ratejobs.models import Call, Job
from ratejobs.selectors import results
from ratejobs.selectors.results import RESULT_FIELDS

REMOVED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
BINARY = b"\xff\xfe\x00\x01"
# What each call of results_job ended with, and the row each must give.
OUTCOMES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (
        {"status": "succeeded", "status_code": 200, "attempts": 1, "duration": 0.25,
         "response_body": '{"id": 0, "name": "é"}'.encode()},
        {"response_body": '{"id": 0, "name": "é"}', "response_body_base64": False},
    ),
    (
        {"status": "succeeded", "status_code": 200, "attempts": 2, "duration": 1.5,
         "response_body": b'plain, "quoted"\nsecond line'},
        {"response_body": 'plain, "quoted"\nsecond line', "response_body_base64": False},
    ),
    (
        {"status": "succeeded", "status_code": 200, "attempts": 1, "duration": 0.5,
         "response_body": BINARY},
        {"response_body": base64.b64encode(BINARY).decode(), "response_body_base64": True},
    ),
    (
        # retention removed the body: null, and the time it went
        {"status": "succeeded", "status_code": 200, "attempts": 1, "duration": 0.5,
         "response_body": None, "response_removed_at": REMOVED_AT},
        {"response_body": None, "response_body_base64": False,
         "response_removed_at": "2026-01-02T03:04:05Z"},
    ),
    (
        {"status": "failed", "status_code": 500, "attempts": 5, "duration": 0.125,
         "error": "HTTP 500 after 5 attempts", "response_body": b"oops",
         "response_truncated": True},
        {"response_body": "oops", "response_body_base64": False, "response_truncated": True},
    ),
    (
        {"status": "cancelled", "error": "job cancelled"},
        {"response_body": None, "response_body_base64": False},
    ),
]  # fmt: skip


def record_outcomes(job: Job) -> Job:
    """The job's calls end as OUTCOMES says (the job needs as many calls)."""
    for index, (fields, _) in enumerate(OUTCOMES):
        Call.objects.filter(job=job, index=index).update(**fields)
    return job


@pytest.fixture
def results_job(make_job) -> Job:
    return record_outcomes(make_job(calls=len(OUTCOMES)))


def expected_rows() -> list[dict[str, Any]]:
    rows = []
    for index, (fields, shown) in enumerate(OUTCOMES):
        row = {
            "index": index,
            "method": "GET",
            "path": f"/items/{index}",
            "status": fields["status"],
            "status_code": fields.get("status_code"),
            "attempts": fields.get("attempts", 0),
            "duration": fields.get("duration"),
            "cost": 0,
            "cost_used": None,
            "error": fields.get("error", ""),
            "response_truncated": False,
            "response_removed_at": None,
            "credential_key": "",
            **shown,
        }
        rows.append({name: row[name] for name in RESULT_FIELDS})
    return rows


def content(response: Any) -> bytes:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content)


def test_jsonl_gives_every_call_in_index_order_with_bodies_as_the_call_pages_do(
    api_client, results_job
):
    response = api_client.get(f"/api/jobs/{results_job.pk}/results.jsonl")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"] == (
        f'attachment; filename="job-{results_job.pk}-results.jsonl"'
    )
    lines = content(response).decode().splitlines()
    assert [json.loads(line) for line in lines] == expected_rows()
    # the same body the one-call route gives
    page = api_client.get(f"/api/jobs/{results_job.pk}/calls/2/").json()
    assert (page["response_body"], page["response_body_base64"]) == (
        json.loads(lines[2])["response_body"],
        True,
    )


def test_csv_gives_a_header_and_the_same_rows_empty_for_null(api_client, results_job):
    response = api_client.get(f"/api/jobs/{results_job.pk}/results.csv")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == (
        f'attachment; filename="job-{results_job.pk}-results.csv"'
    )
    table = list(csv.reader(io.StringIO(content(response).decode(), newline="")))
    assert table[0] == list(RESULT_FIELDS)

    def as_csv(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    assert table[1:] == [[as_csv(row[name]) for name in RESULT_FIELDS] for row in expected_rows()]


def test_another_users_job_is_a_404_and_a_job_being_purged_is_gone(
    api_client, results_job, client_for, other_user, superuser
):
    for suffix in ("jsonl", "csv"):
        url = f"/api/jobs/{results_job.pk}/results.{suffix}"
        refused = client_for(other_user).get(url, HTTP_ACCEPT="text/csv")
        assert refused.status_code == 404 and refused["Content-Type"] == "application/json"
        assert "plain" not in refused.content.decode()
        assert client_for(superuser).get(url).status_code == 200
        assert client_for(None).get(url).status_code == 401
    Job.objects.filter(pk=results_job.pk).update(purge_started=REMOVED_AT)
    assert api_client.get(f"/api/jobs/{results_job.pk}/results.jsonl").status_code == 404


def test_an_accept_header_asking_for_the_file_type_gets_the_file(api_client, results_job):
    response = api_client.get(f"/api/jobs/{results_job.pk}/results.csv", HTTP_ACCEPT="text/csv")
    assert response.status_code == 200 and content(response).startswith(b"index,method,")


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_the_download_streams_from_one_query_however_many_calls(
    api_client, make_job, settings, monkeypatch, suffix
):
    # given: bodies up to 64 MiB, so the cursor fetches the fewest rows at a time (16): 500
    # calls take many fetches, and pieces of 1 KiB many writes
    settings.RATEJOBS_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
    monkeypatch.setattr(results, "PIECE_BYTES", 1024)
    counts = []
    for calls in (5, 500):
        job = make_job(calls=calls)
        Call.objects.filter(job=job).update(status="succeeded", response_body=b"x" * 40)
        with CaptureQueriesContext(connection) as queries:
            response = api_client.get(f"/api/jobs/{job.pk}/results.{suffix}")
            pieces = list(response.streaming_content)
        assert isinstance(response, StreamingHttpResponse)
        assert b"".join(pieces).count(b"x" * 40) == calls
        counts.append(len(queries))
    assert counts[0] == counts[1]
    assert len(pieces) > 10  # written as it is read, not at the end


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql  # pg_cursors
def test_postgresql_reads_the_calls_through_a_cursor_inside_a_transaction(make_job, settings):
    # given: autocommit, as in a web request; a cursor declared WITH HOLD there would make the
    # server compute every row before the first
    settings.RATEJOBS_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
    job = make_job(calls=200)
    rows = results.call_result_rows(job)
    assert next(rows)[0] == 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT is_holdable FROM pg_cursors")
        assert [held for (held,) in cursor.fetchall()] == [False]
    assert sum(1 for _ in rows) == 199
    assert connection.get_autocommit()  # the transaction ended with the rows


def test_the_schema_documents_both_files_with_their_media_types(client_for):
    schema = client_for(None).get("/api/schema/?format=json").json()
    for suffix, media_type in (("jsonl", "application/x-ndjson"), ("csv", "text/csv")):
        operation = schema["paths"][f"/api/jobs/{{job_id}}/results.{suffix}"]["get"]
        assert list(operation["responses"]["200"]["content"]) == [media_type]
        assert "Content-Disposition" in operation["responses"]["200"]["headers"]
        assert {"401", "404"} <= set(operation["responses"])
        assert "response_body_base64" in operation["description"]
