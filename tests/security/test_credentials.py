"""A worker's environment is never sent to an attacker's host through credential_env, and a
stored credential never follows a new base_url; plus the rules on the
credential's header name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from ratejobs.crypto import encrypt_secret
from ratejobs.models import Api, Call
from ratejobs.services.calls import call_attempt_by_id
from ratejobs.services.jobs import job_create

CANARY = "canary-env-secret-3c9d1e"


def api_payload(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "base_url": "https://api.example.com/v1", "rate": 5, **fields}


@pytest.mark.parametrize("role", ["user", "staff"])
def test_only_managers_may_create_or_change_an_api(request, client_for, unique_name, api, role):
    # given: an attacker who is a staff member but not a superuser
    client = client_for(request.getfixturevalue(role))
    payload = api_payload(unique_name, auth_header="X-Leak", credential_env="RATEJOBS_CRED_X")
    assert client.post("/api/apis/", payload, format="json").status_code == 403
    moved = client.patch(
        f"/api/apis/{api.name}/", {"base_url": "https://attacker.example"}, format="json"
    )
    assert moved.status_code == 403
    api.refresh_from_db()
    assert api.base_url == "https://api.example.com/v1"
    assert not Api.objects.filter(name=unique_name).exists()


@pytest.mark.parametrize(
    "variable", ["DJANGO_SECRET_KEY", "DATABASE_URL", "RATEJOBS_CREDENTIALS_KEY", "NO_SUCH_VAR"]
)
def test_credential_env_outside_the_prefix_is_refused_without_saying_whether_it_exists(
    client_for, manager, unique_name, monkeypatch, variable
):
    monkeypatch.setenv("DJANGO_SECRET_KEY", CANARY)
    monkeypatch.setenv("DATABASE_URL", CANARY)
    monkeypatch.delenv("NO_SUCH_VAR", raising=False)
    payload = api_payload(unique_name, auth_header="X-Leak", credential_env=variable)
    response = client_for(manager).post("/api/apis/", payload, format="json")
    assert response.status_code == 400
    # the same words whether the variable exists or not
    assert response.json() == {
        "credential_env": [
            "credential_env must name a variable starting with RATEJOBS_CRED_ (for example "
            "RATEJOBS_CRED_GITHUB), or one the operator listed in RATEJOBS_CREDENTIAL_ENV_ALLOW"
        ]
    }
    patched = client_for(manager).patch(
        "/api/apis/nope/", {"credential_env": variable}, format="json"
    )
    assert patched.status_code == 404
    assert not Api.objects.filter(name=unique_name).exists()


def test_credential_env_under_the_prefix_or_listed_by_the_operator_is_accepted(
    client_for, manager, unique_name, settings
):
    settings.RATEJOBS_CREDENTIAL_ENV_ALLOW = ["LEGACY_PARTNER_TOKEN"]
    client = client_for(manager)
    for n, variable in enumerate(["RATEJOBS_CRED_GITHUB", "LEGACY_PARTNER_TOKEN"]):
        payload = api_payload(f"{unique_name}-{n}", credential_env=variable)
        assert client.post("/api/apis/", payload, format="json").status_code == 201
    bare_prefix = api_payload(f"{unique_name}-x", credential_env="RATEJOBS_CRED_")
    assert client.post("/api/apis/", bare_prefix, format="json").status_code == 400


def test_a_worker_never_sends_a_variable_outside_the_prefix_even_from_an_old_row(
    http_server, marker, monkeypatch, user, unique_name
):
    # given: a row written before the rule (or by hand) naming the worker's secret key, and
    # the attacker's server on loopback; expect: the call fails and the secret is never sent
    monkeypatch.setenv("DJANGO_SECRET_KEY", CANARY)
    api = Api.objects.create(
        name=f"{unique_name}-old",
        base_url=http_server.base,
        rate=100,
        auth_header="X-Leak",
        credential_env="DJANGO_SECRET_KEY",
    )
    job = job_create(owner=user, api=api, name="leak", calls=[{"path": f"/echo/{marker}"}])
    call = Call.objects.get(job=job)
    Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())

    assert call_attempt_by_id(call_id=call.pk) == "failed"

    call.refresh_from_db()
    assert call.status == "failed" and "RATEJOBS_CRED_" in call.error
    assert CANARY not in call.error
    assert http_server.requests_with(marker) == []


def test_an_allowed_variable_is_sent_under_the_auth_header(
    http_server, marker, monkeypatch, user, unique_name, make_api
):
    monkeypatch.setenv("RATEJOBS_CRED_PARTNER", CANARY)
    api = make_api(base_url=http_server.base, auth_header="X-Key",
                   credential_env="RATEJOBS_CRED_PARTNER")  # fmt: skip
    job = job_create(owner=user, api=api, name="ok", calls=[{"path": f"/echo/{marker}"}])
    Call.objects.filter(job=job).update(dispatched_at=timezone.now())

    assert call_attempt_by_id(call_id=Call.objects.get(job=job).pk) == "succeeded"

    (seen,) = http_server.requests_with(marker)
    assert seen.headers.get("X-Key") == CANARY


def test_moving_an_api_with_a_credential_to_another_origin_needs_the_credential_again(
    client_for, manager, api
):
    client = client_for(manager)
    url = f"/api/apis/{api.name}/"
    # given: the API (https://api.example.com/v1) has a stored credential
    moved = client.patch(url, {"base_url": "https://attacker.example/v1"}, format="json")
    assert moved.status_code == 400 and "credential" in json.dumps(moved.json()["base_url"])
    for other_origin in ("http://api.example.com/v1", "https://api.example.com:8443/v1"):
        assert client.patch(url, {"base_url": other_origin}, format="json").status_code == 400
    api.refresh_from_db()
    assert api.base_url == "https://api.example.com/v1" and api.credential_encrypted

    # a new path on the same origin keeps it
    same_origin = client.patch(url, {"base_url": "https://API.example.com/v2"}, format="json")
    assert same_origin.status_code == 200 and same_origin.json()["has_credential"]

    # the credential sent again, or removed, in the same change
    again = client.patch(
        url, {"base_url": "https://new.example/v1", "credential": "new-secret"}, format="json"
    )
    assert again.status_code == 200 and again.json()["has_credential"]
    dropped = client.patch(
        url, {"base_url": "https://other.example/v1", "credential": ""}, format="json"
    )
    assert dropped.status_code == 200 and not dropped.json()["has_credential"]


def test_moving_an_api_in_the_admin_needs_the_credential_again(admin_client_for, manager, api):
    client = admin_client_for(manager)
    page = f"/admin/ratejobs/api/{api.pk}/change/"
    form = {
        "base_url": "https://attacker.example/v1", "rate": api.rate, "period": api.period,
        "burst": api.burst, "max_concurrency": 0, "max_attempts": 5,
        "max_throttled_retries": 50, "timeout": 30, "default_headers": "{}",
        "auth_header": "Authorization", "credential_env": "", "credential": "",
    }  # fmt: skip
    refused = client.post(page, form)
    assert refused.status_code == 200  # the form again, with its error
    assert "another scheme, host or port" in refused.content.decode()
    api.refresh_from_db()
    assert api.base_url == "https://api.example.com/v1"

    moved = client.post(page, {**form, "credential_to_new_origin": "on"})
    assert moved.status_code == 302
    api.refresh_from_db()
    assert api.base_url == "https://attacker.example/v1" and api.credential_encrypted


@pytest.mark.parametrize(
    "header",
    ["Host", "content-length", "Transfer-Encoding", "Connection", "Cookie", "Keep-Alive", "TE",
     "Upgrade", "Proxy-Authorization", "X Leak", "X-Leak\r\nX-Other"],
)  # fmt: skip
def test_auth_header_cannot_name_a_header_of_the_connection_or_the_client(
    client_for, manager, unique_name, header
):
    payload = api_payload(unique_name, auth_header=header, credential="s3cr3t")
    response = client_for(manager).post("/api/apis/", payload, format="json")
    assert response.status_code == 400 and "auth_header" in response.json()
    assert not Api.objects.filter(name=unique_name).exists()


def test_a_credential_and_a_credential_env_together_are_refused(
    client_for, manager, unique_name, api
):
    client = client_for(manager)
    both = api_payload(unique_name, credential="s3cr3t", credential_env="RATEJOBS_CRED_A")
    assert client.post("/api/apis/", both, format="json").status_code == 400
    # given: `api` has a stored credential; adding an env name must also drop the secret
    url = f"/api/apis/{api.name}/"
    added = client.patch(url, {"credential_env": "RATEJOBS_CRED_A"}, format="json")
    assert added.status_code == 400 and "credential" in added.json()
    swapped = client.patch(url, {"credential_env": "RATEJOBS_CRED_A", "credential": ""},
                           format="json")  # fmt: skip
    assert swapped.status_code == 200 and swapped.json()["credential_env"] == "RATEJOBS_CRED_A"
    api.refresh_from_db()
    assert api.credential_encrypted == ""


def test_default_headers_may_not_carry_the_credential_header_or_the_clients(
    client_for, manager, unique_name
):
    client = client_for(manager)
    for n, headers in enumerate([{"Authorization": "Bearer x"}, {"Host": "evil"}, {"a b": "c"}]):
        payload = api_payload(f"{unique_name}-{n}", default_headers=headers)
        response = client.post("/api/apis/", payload, format="json")
        assert response.status_code == 400 and "default_headers" in response.json()


def test_the_stored_credential_is_encrypted_and_never_in_a_response(
    client_for, manager, superuser, unique_name
):
    created = client_for(manager).post(
        "/api/apis/", api_payload(unique_name, credential=CANARY), format="json"
    )
    assert created.status_code == 201 and CANARY not in created.content.decode()
    stored = Api.objects.get(name=unique_name)
    assert CANARY not in stored.credential_encrypted
    assert encrypt_secret(CANARY) != stored.credential_encrypted  # Fernet: a fresh IV each time
    for person in (manager, superuser):
        assert CANARY not in client_for(person).get(f"/api/apis/{unique_name}/").content.decode()


def test_a_customers_key_secret_is_encrypted_and_in_no_answer_row_or_error(
    client_for, admin_client_for, manager, superuser, http_server, marker, make_api
):
    # given an API with a customer's key whose secret is the canary, and a job sent with it
    api = make_api(base_url=http_server.base)
    client = client_for(manager)
    added = client.post(
        f"/api/apis/{api.name}/credentials/", [{"key": "acme", "secret": CANARY}], format="json"
    )
    assert added.status_code == 201
    job = job_create(owner=superuser, api=api, name="j", calls=[{"path": f"/ok/{marker}"}],
                     credential_key="acme")  # fmt: skip
    Call.objects.filter(job=job).update(dispatched_at=timezone.now())
    assert call_attempt_by_id(call_id=job.calls.get().pk) == "succeeded"
    # expect: the API got it in its auth_header, and nothing we store or answer holds it
    (seen,) = http_server.requests_with(marker)
    assert seen.headers.get("Authorization") == CANARY
    assert CANARY not in api.credentials.get().credential_encrypted
    for row in Call.objects.filter(job=job).values():
        assert CANARY not in repr(row)
    root = client_for(superuser)
    pages = [
        client.get(f"/api/apis/{api.name}/credentials/"),
        client.put(f"/api/apis/{api.name}/credentials/acme/", {"secret": CANARY}, format="json"),
        root.get(f"/api/jobs/{job.pk}/"),
        root.get(f"/api/jobs/{job.pk}/calls/"),
        admin_client_for(superuser).get(f"/admin/ratejobs/api/{api.pk}/change/"),
    ]
    for page in pages:
        assert page.status_code == 200 and CANARY not in page.content.decode()
    results = root.get(f"/api/jobs/{job.pk}/results.jsonl")
    assert CANARY not in b"".join(results.streaming_content).decode()
