"""Job callbacks through the REST API: the signing key shown once, a callback_url checked by
the URL rules and the callback address policy (never connecting), and the delivery's state on
the job."""

from __future__ import annotations

import pytest

from ratejobs.crypto import decrypt_secret
from ratejobs.models import Job, SigningKey
from ratejobs.services.callbacks import NOT_ALLOWED_MESSAGE
from tests.rest.test_jobs import counts, job_payload

HOOK = "http://127.0.0.1:9/hooks/ratejobs"


@pytest.fixture
def secret(api_client) -> str:
    response = api_client.post("/api/signing-key/", {}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["secret"]


def test_the_signing_key_secret_is_shown_once_and_stored_only_encrypted(api_client, user):
    assert api_client.get("/api/signing-key/").json() == {
        "exists": False,
        "created": None,
        "rotated": None,
    }
    made = api_client.post("/api/signing-key/", format="json")
    assert made.status_code == 201 and made["Cache-Control"] == "no-store"
    secret = made.json()["secret"]
    assert made.json()["exists"] and made.json()["rotated"] is None
    shown = api_client.get("/api/signing-key/")
    assert shown.status_code == 200
    assert set(shown.json()) == {"exists", "created", "rotated"} and shown.json()["exists"]
    assert secret not in shown.content.decode()
    stored = SigningKey.objects.get(user=user)
    assert (
        secret not in stored.secret_encrypted and decrypt_secret(stored.secret_encrypted) == secret
    )
    # expect: rotating gives a new secret, and the old one is gone
    rotated = api_client.post("/api/signing-key/", format="json").json()
    assert rotated["secret"] != secret and rotated["rotated"] is not None
    stored.refresh_from_db()
    assert decrypt_secret(stored.secret_encrypted) == rotated["secret"]


def test_the_signing_key_takes_no_fields(api_client, user):
    response = api_client.post("/api/signing-key/", {"secret": "mine"}, format="json")
    assert response.status_code == 400 and "secret" in response.json()
    assert not SigningKey.objects.filter(user=user).exists()


def test_a_callback_url_needs_a_signing_key_first(api_client, api, user):
    response = api_client.post(
        "/api/jobs/", job_payload(api.name, callback_url=HOOK), format="json"
    )
    assert response.status_code == 400
    assert response.json()["callback_url"] == ["create a signing key first: POST /api/signing-key/"]
    assert counts(user) == (0, 0)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "https://[::ffff:10.0.0.1]/hook",
        "http://127.0.0.2:8080/hook",  # loopback outside the tests' allow-list
        "http://127.0.0.1:8080/hook",  # allowed for the tests' APIs, not for these callbacks
    ],
)
def test_a_callback_to_an_address_the_callback_policy_refuses_is_400_in_one_message(
    api_client, api, user, secret, url, settings
):
    # given callbacks allowed nowhere but public addresses (the default), APIs on loopback;
    # literal addresses: judged as they are, nothing is resolved or connected to
    settings.RATEJOBS_CALLBACK_ALLOW = []
    response = api_client.post("/api/jobs/", job_payload(api.name, callback_url=url), format="json")
    # expect: the same words whatever the range, naming no address and no reason
    assert response.status_code == 400
    assert response.json()["callback_url"] == [NOT_ALLOWED_MESSAGE]
    assert counts(user) == (0, 0)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://hooks.example.com/x",
        "https://user:password@hooks.example.com/x",
        "https://hooks.example.com/x?token=1",
        "https://hooks.example.com/a/../b",
        "not a url",
    ],
)
def test_a_callback_url_that_is_not_a_plain_http_url_is_400(api_client, api, user, secret, url):
    response = api_client.post("/api/jobs/", job_payload(api.name, callback_url=url), format="json")
    assert response.status_code == 400 and "callback_url" in response.json()
    assert counts(user) == (0, 0)


def test_a_job_shows_its_callback_and_the_delivery_after_it_finishes(api_client, api, secret):
    created = api_client.post("/api/jobs/", job_payload(api.name, callback_url=HOOK), format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["callback_url"] == HOOK
    assert (body["callback_status"], body["callback_attempts"]) == ("", 0)
    assert body["callback_delivered_at"] is None
    # expect: a cancel finishes the job, and its delivery is pending in the same statement
    cancelled = api_client.post(f"/api/jobs/{body['id']}/cancel/")
    assert cancelled.status_code == 200
    detail = api_client.get(f"/api/jobs/{body['id']}/").json()
    assert detail["status"] == "cancelled" and detail["callback_status"] == "pending"
    assert Job.objects.get(pk=body["id"]).callback_delivery is not None


def test_an_upload_takes_a_callback_url_as_a_parameter(api_client, api, secret):
    response = api_client.generic(
        "POST",
        f"/api/jobs/upload/?api={api.name}&name=up&callback_url={HOOK}",
        b'{"path": "/x"}\n',
        content_type="application/x-ndjson",
    )
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).callback_url == HOOK
    refused = api_client.generic(
        "POST",
        f"/api/jobs/upload/?api={api.name}&name=up&callback_url=http://169.254.169.254/",
        b'{"path": "/x"}\n',
        content_type="application/x-ndjson",
    )
    assert refused.status_code == 400 and "callback_url" in refused.json()


def test_a_job_without_a_callback_gets_no_delivery(api_client, api):
    created = api_client.post("/api/jobs/", job_payload(api.name), format="json").json()
    api_client.post(f"/api/jobs/{created['id']}/cancel/")
    job = Job.objects.get(pk=created["id"])
    assert (job.callback_status, job.callback_delivery) == ("", None)
