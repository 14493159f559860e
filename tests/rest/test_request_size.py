"""Request size: every REST route refuses a body over its limit with a JSON 413 before reading
it, with or without Content-Length, at the real settings' boundary (Django's own
DATA_UPLOAD_MAX_MEMORY_SIZE never answers first); a job's calls are counted before any is
checked; refusing a 60 MiB body costs the web process next to no memory (REFUSAL_GROWTH), and
no body within the limits makes it grow by more than MAX_GROWTH (measured on a real gunicorn
worker)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.core.exceptions import RequestDataTooBig
from rest_framework.authtoken.models import Token

from ratejobs.models import Call, Job
from ratejobs.rest.errors import exception_handler
from ratejobs.rest.parsers import MAX_JSON_DEPTH
from tests.rest.realserver import MIB, post_raw

# An attacker's body: 60 MiB of calls.
ATTACK_BYTES = 60 * MIB
# Peak memory a single request may add to the web process (three at once on a small machine).
MAX_GROWTH = 200 * MIB
# Peak memory the six refusals of ATTACK_BYTES may add. Measured: 0.9 to 2.1 MiB in 11 runs,
# all of it from the chunked ones (a declared Content-Length is refused unread: 0.0), which
# spool SPOOL_MEMORY_BYTES (1 MiB) in memory before the limit stops them. Twice the most seen;
# half of what holding one body of RATEJOBS_MAX_REQUEST_BYTES (8 MiB) in memory would add.
REFUSAL_GROWTH = 4 * MIB
# json.dumps writes an empty array in a list as "[], ": a JSON body of this many stays within
# RATEJOBS_MAX_CALL_BODY_BYTES (1 MiB) and is the most objects one valid call can carry.
EMPTY_ARRAYS_PER_CALL = 262_000


def job_body(api_name: str, calls: Any, size: int | None = None, **fields: Any) -> bytes:
    """A job as JSON, padded with trailing spaces to exactly `size` bytes when given."""
    body = json.dumps({"api": api_name, "name": "sized", "calls": calls, **fields}).encode()
    if size is not None:
        assert len(body) <= size
        body += b" " * (size - len(body))
    return body


def post_json(client: Any, path: str, body: bytes) -> Any:
    return client.generic("POST", path, body, content_type="application/json")


def jobs_of(owner: Any) -> tuple[int, int]:
    return Job.objects.filter(owner=owner).count(), Call.objects.filter(job__owner=owner).count()


# -- the boundary, with the settings as they are -------------------------------------------


def test_a_job_body_of_exactly_the_limit_is_read_and_one_byte_more_is_a_json_413(
    api_client, api, user, settings
):
    limit = settings.RATEJOBS_MAX_REQUEST_BYTES  # not lowered: the real default
    body = job_body(api.name, [{"path": "/a"}], size=limit)

    accepted = post_json(api_client, "/api/jobs/", body)
    refused = post_json(api_client, "/api/jobs/", body + b" ")

    assert accepted.status_code == 201, accepted.content[:300]
    assert refused.status_code == 413
    assert refused["Content-Type"] == "application/json"
    assert refused.json()["detail"] == (
        f"Request body too large: the limit is {limit} bytes (RATEJOBS_MAX_REQUEST_BYTES)."
    )
    assert jobs_of(user) == (1, 1)


def test_djangos_own_upload_cap_never_refuses_an_api_request(api_client, api, settings):
    # given: Django's default cap (2.5 MiB), well under ours; expect: nothing in the API reads
    # request.body, so our limit alone decides: 3 MiB in, and 413 (not 400) past ours.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
    calls = [{"method": "POST", "path": f"/{i}", "body": "x" * (768 * 1024)} for i in range(4)]
    assert post_json(api_client, "/api/jobs/", job_body(api.name, calls)).status_code == 201
    over = job_body(api.name, [{"path": "/a"}], size=settings.RATEJOBS_MAX_REQUEST_BYTES + 1)
    assert post_json(api_client, "/api/jobs/", over).status_code == 413


def test_djangos_request_data_too_big_is_a_413_if_anything_raises_it():
    response = exception_handler(RequestDataTooBig("exceeded"), {})
    assert response is not None and response.status_code == 413


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/jobs/"),
        ("GET", "/api/jobs/"),
        ("POST", "/api/apis/"),
        ("PATCH", "/api/apis/{api}/"),
        ("POST", "/api/jobs/{job}/pause/"),
        ("GET", "/api/jobs/{job}/calls/"),
    ],
)
def test_every_rest_route_refuses_a_body_over_the_limit_unread(
    client_for, superuser, make_job, settings, method, path
):
    job = make_job()
    limit = settings.RATEJOBS_MAX_REQUEST_BYTES
    url = path.format(api=job.api.name, job=job.pk)
    response = client_for(superuser).generic(
        method, url, b"{" + b" " * limit + b"}", content_type="application/json"
    )
    assert response.status_code == 413
    assert "RATEJOBS_MAX_REQUEST_BYTES" in response.json()["detail"]
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED  # the pause never ran


def test_the_upload_route_has_its_own_limit(api_client, api, settings):
    settings.RATEJOBS_MAX_UPLOAD_BYTES = 1000
    lines = b"".join(b'{"path": "/items/%d"}\n' % i for i in range(100))
    response = api_client.generic(
        "POST", f"/api/jobs/upload/?api={api.name}&name=big", lines,
        content_type="application/x-ndjson",
    )  # fmt: skip
    assert response.status_code == 413
    assert "1000 bytes (RATEJOBS_MAX_UPLOAD_BYTES)" in response.json()["detail"]


# -- what parsing may build ----------------------------------------------------------------


def test_more_calls_than_the_maximum_are_refused_before_any_is_checked(
    api_client, api, user, settings
):
    # given: 100,001 calls, every one of them invalid; expect: the count is the answer (no call
    # was checked), at once, and nothing is stored.
    most = settings.RATEJOBS_MAX_CALLS_PER_REQUEST
    body = job_body(api.name, [{"path": "", "bogus": i} for i in range(most + 1)])
    started = time.perf_counter()
    response = post_json(api_client, "/api/jobs/", body)
    elapsed = time.perf_counter() - started

    assert response.status_code == 400
    assert response.json() == {
        "calls": [
            f"More than {most} calls: at most {most} per job (RATEJOBS_MAX_CALLS_PER_REQUEST); "
            "upload larger jobs as JSON lines to /api/jobs/upload/."
        ]
    }
    print(f"\n{most + 1} calls ({len(body)} bytes) refused in {elapsed:.3f} s")
    assert elapsed < 2.0  # it took 12.8 s when every call was validated first
    assert jobs_of(user) == (0, 0)


def test_a_call_with_more_values_than_its_body_could_hold_is_refused_unbuilt(api_client, api, user):
    calls = [{"path": "/ok"}, {"path": "/big", "json": [0] * 600_000}]
    response = post_json(api_client, "/api/jobs/", job_body(api.name, calls))
    assert response.status_code == 400
    message = response.json()["calls"]["1"]["non_field_errors"][0]
    assert "RATEJOBS_MAX_CALL_BODY_BYTES" in message
    assert jobs_of(user) == (0, 0)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "nested too deep"),
        (b'{"name": "x", "rate": [' + b"0," * 200_000 + b"0]}", "Too many JSON values"),
        (b'{"name": "x", "name": "y"}', None),
        (b'{"name": "x"} trailing', "JSON parse error"),
    ],
)
def test_other_json_bodies_are_counted_before_they_are_built(client_for, superuser, body, message):
    response = post_json(client_for(superuser), "/api/apis/", body)
    assert response.status_code == 400  # never a 500 (RecursionError) nor a huge allocation
    if message:
        assert message in response.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"api": "x", "name": "a", "calls": [], "calls": [{"path": "/b"}]}',
        b'{"api": "x", "calls": ['
        + b"[" * (MAX_JSON_DEPTH + 1)
        + b"]" * (MAX_JSON_DEPTH + 1)
        + b"]}",
        b'{"api": "x", "calls": [{"path": "/a"}]} {"again": 1}',
        b'[{"path": "/a"}]',
    ],
)
def test_malformed_job_bodies_are_400(api_client, user, body):
    response = post_json(api_client, "/api/jobs/", body)
    assert response.status_code == 400, response.content
    assert jobs_of(user) == (0, 0)


# -- a real server: the whole stack, and the memory of the process that serves ---------------


@pytest.fixture
def token_and_api(django_user_model, make_api) -> tuple[str, str]:
    """A superuser's token (every route is open to it) and an API, committed for the server."""
    person = django_user_model.objects.create_superuser("root-size", password="root-password")
    return Token.objects.create(user=person).key, make_api().name


def _warm(server: Any, token: str, api_name: str) -> None:
    """One small job and one refusal, so that imports and first-use caches are counted before
    the measurement starts, not in it."""
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    body = job_body(api_name, [{"path": f"/warm/{i}"} for i in range(3000)])
    assert post_raw(server.url, "/api/jobs/", headers, body).status == 201
    assert post_raw(server.url, "/api/jobs/", headers, b"{" + b" " * 9 * MIB).status == 413


def _attack_body(api_name: str) -> bytes:
    item = b"{},"
    head = b'{"api": "%s", "name": "attack", "calls": [' % api_name.encode()
    return head + item * ((ATTACK_BYTES - len(head) - 2) // len(item)) + b"{}]}"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_a_60_mib_body_is_a_json_413_with_and_without_content_length_and_costs_no_memory(
    web_server, token_and_api
):
    token, api_name = token_and_api
    server = web_server(debug=True)  # Django's debug page, if anything let it answer
    _warm(server, token, api_name)
    before = server.peak_rss()
    body = _attack_body(api_name)
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    for path in ("/api/jobs/", "/api/jobs/1/pause/", "/api/apis/"):
        for chunked in (False, True):
            response = post_raw(server.url, path, headers, body, chunked=chunked)
            assert response.status == 413, (path, chunked, response.body[:300])
            assert response.content_type == "application/json"  # never Django's debug page
            assert b"RATEJOBS_MAX_REQUEST_BYTES" in response.body
    growth = server.peak_rss() - before
    print(f"\n60 MiB bodies, 6 refused: peak RSS of the worker grew {growth / MIB:.1f} MiB")
    assert growth < REFUSAL_GROWTH


def _many_empty_objects(api_name: str, limit: int) -> bytes:
    # just within the limit; refused by the count of calls, before any is built
    head = b'{"api": "%s", "name": "empties", "calls": [' % api_name.encode()
    return head + b"{}," * ((limit - len(head) - 4) // 3) + b"{}]}"


def _one_call_of_empty_arrays(api_name: str, limit: int) -> bytes:
    # one call's JSON body holding all of the request: refused by its count of values
    head = b'{"api": "%s", "name": "nested", "calls": [{"path": "/a", "json": [' % (
        api_name.encode()
    )
    return head + b"[]," * ((limit - len(head) - 8) // 3) + b"[]]}]}"


def _valid_calls_of_empty_arrays(api_name: str, limit: int) -> bytes:
    # the worst body that is accepted: calls whose JSON bodies are as many objects as a valid
    # body can be, as many calls as fit (each stored whole)
    call = b'{"path": "/a", "json": [' + b"[]," * (EMPTY_ARRAYS_PER_CALL - 1) + b"[]]}"
    head = b'{"api": "%s", "name": "worst", "calls": [' % api_name.encode()
    count = (limit - len(head) - 2) // (len(call) + 1)
    return head + b",".join([call] * count) + b"]}"


def _empty_arrays_to_another_route(api_name: str, limit: int) -> bytes:
    head = b'{"name": "x", "base_url": ['
    return head + b"[]," * ((limit - len(head) - 4) // 3) + b"[]]}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("make_body", "path", "expected"),
    [
        (_many_empty_objects, "/api/jobs/", 400),
        (_one_call_of_empty_arrays, "/api/jobs/", 400),
        (_valid_calls_of_empty_arrays, "/api/jobs/", 201),
        (_empty_arrays_to_another_route, "/api/apis/", 400),
    ],
)
@pytest.mark.slow
def test_the_worst_bodies_within_the_limit_stay_within_the_memory_bound(
    web_server, token_and_api, settings, make_body, path, expected
):
    token, api_name = token_and_api
    server = web_server()
    _warm(server, token, api_name)
    before = server.peak_rss()
    body = make_body(api_name, settings.RATEJOBS_MAX_REQUEST_BYTES)
    assert len(body) <= settings.RATEJOBS_MAX_REQUEST_BYTES
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    started = time.perf_counter()
    response = post_raw(server.url, path, headers, body)
    elapsed = time.perf_counter() - started
    growth = server.peak_rss() - before
    print(
        f"\n{make_body.__name__} ({len(body) / MIB:.1f} MiB) to {path}: {response.status} in "
        f"{elapsed:.2f} s, peak RSS of the worker grew {growth / MIB:.1f} MiB"
    )
    assert response.status == expected, response.body[:500]
    assert growth < MAX_GROWTH
