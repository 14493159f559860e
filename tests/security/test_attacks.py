"""Five attacks, replayed step by step as an attacker with an ordinary staff account would run
them, through the real REST routes, the worker's code
(call_attempt_by_id, the same service a Celery task runs) and real HTTP servers on loopback.
Each must fail and leave nothing behind.

Attack 5 (memory) needs a real web server process to measure: see
tests/rest/test_request_size.py (test_a_60_mib_body_is_a_json_413_with_and_without_content_
length_and_costs_no_memory, test_the_worst_bodies_within_the_limit_stay_within_the_memory_bound,
test_more_calls_than_the_maximum_are_refused_before_any_is_checked).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from ratejobs.models import Api, Call, Job
from ratejobs.services.calls import call_attempt_by_id
from tests.realhttp import TestServer, serving

SECRET = "worker-secret-0d6c1b"
INTERNAL = "internal-only-answer-5e2f"
METADATA_PATH = "/answer/meta-data"  # where internal_service answers INTERNAL


def run_job(client: Any, api_name: str, path: str) -> Call | None:
    """Submit a one-call job as `client` and run its call as a worker would; None if refused."""
    created = client.post(
        "/api/jobs/", {"api": api_name, "name": "probe", "calls": [{"path": path}]}, format="json"
    )
    if created.status_code != 201:
        return None
    call = Call.objects.get(job_id=created.json()["id"])
    Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())
    call_attempt_by_id(call_id=call.pk)
    call.refresh_from_db()
    return call


def test_attack_1_a_worker_secret_is_sent_to_the_attackers_host(
    client_for, staff, manager, http_server, marker, monkeypatch, unique_name
):
    # given: a worker whose environment holds a secret, and the attacker's server
    monkeypatch.setenv("DJANGO_SECRET_KEY", SECRET)
    attack = {"name": unique_name, "base_url": http_server.base, "rate": 10,
              "auth_header": "X-Leak", "credential_env": "DJANGO_SECRET_KEY"}  # fmt: skip
    # when: a staff member, then even a manager, configures the API and runs one call
    for person in (staff, manager):
        client = client_for(person)
        client.post("/api/apis/", attack, format="json")
        run_job(client, unique_name, f"/echo/{marker}")
    # expect: nothing was configured, and no request carried the secret anywhere
    assert not Api.objects.filter(name=unique_name).exists()
    assert all(SECRET not in str(seen.headers) for seen in http_server.requests_with(marker))


def test_attack_2_a_stored_credential_follows_a_new_base_url(
    client_for, staff, manager, http_server, marker, make_api
):
    # given: an API on 127.0.0.1 with a stored credential; "localhost" is the same server under
    # another origin, standing for the attacker's host
    api = make_api(base_url=http_server.base, credential="stored-api-key", auth_header="X-Key")
    moved_to = http_server.url("", host="localhost")
    for person in (staff, manager):
        client = client_for(person)
        client.patch(f"/api/apis/{api.name}/", {"base_url": moved_to}, format="json")
        run_job(client, api.name, f"/echo/{marker}")
    # expect: the API stayed where it was, and the key went nowhere else
    api.refresh_from_db()
    assert api.base_url == http_server.base
    for seen in http_server.requests_with(marker):
        assert seen.headers.get("Host", "").startswith("127.0.0.1")


@pytest.fixture
def internal_service() -> Iterator[TestServer]:
    """A service on 127.0.0.2, outside the tests' allow-list (127.0.0.1): the internal network
    (a metadata service, an admin port) as far as the outbound policy is concerned. It answers
    INTERNAL at METADATA_PATH and records every request."""
    with serving("127.0.0.2") as server:
        server.answer("meta-data", 200, {}, INTERNAL.encode())
        yield server


@pytest.mark.parametrize("host", ["127.0.0.2", "0x7f000002", "2130706434", "[::ffff:127.0.0.2]"])
def test_attack_3_ssrf_reads_an_internal_service(
    client_for, manager, user, internal_service, unique_name, host
):
    port = internal_service.port
    base_url = f"http://{host}:{port}"
    # when: the API is configured at the internal address (in a numeric form, say) ...
    created = client_for(manager).post(
        "/api/apis/", {"name": unique_name, "base_url": base_url, "rate": 10}, format="json"
    )
    assert created.status_code == 400  # numeric forms are not even valid URLs to Django
    if host == "127.0.0.2":
        assert "outbound policy" in str(created.json()["base_url"])
    # ... or was stored before the rule, or resolves elsewhere by the time a worker calls it
    api = Api.objects.create(name=f"{unique_name}-old", base_url=base_url, rate=10)
    call = run_job(client_for(user), api.name, METADATA_PATH)
    # expect: refused at connect time, nothing reached the service, nothing to read
    assert call is not None and call.status == "failed" and call.attempts <= 1
    assert "not allowed by the outbound policy" in call.error
    assert internal_service.seen == []
    calls = client_for(user).get(f"/api/jobs/{call.job_id}/calls/").content.decode()
    assert INTERNAL not in calls


def test_attack_4_other_users_jobs_are_read_and_cancelled_over_rest(
    client_for, staff, manager, other_user, make_job
):
    # given: another user's job with a stored response
    theirs = make_job(owner=other_user)
    Call.objects.filter(job=theirs).update(response_body=b"their-private-response")
    for person in (staff, manager):
        client = client_for(person)
        read = client.get(f"/api/jobs/{theirs.pk}/calls/")
        cancelled = client.post(f"/api/jobs/{theirs.pk}/cancel/")
        assert (read.status_code, cancelled.status_code) == (404, 404)
        assert b"their-private-response" not in read.content
        listed = client.get("/api/jobs/").json()["results"]
        assert theirs.pk not in {job["id"] for job in listed}
    assert Job.objects.get(pk=theirs.pk).status == "queued"
