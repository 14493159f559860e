"""Credentials per customer over REST: managers add (one or thousands, all or nothing), list,
replace and delete keys; secrets are never answered; jobs and calls naming keys are checked."""

from __future__ import annotations

import io
from csv import DictReader
from typing import Any

import pytest

from ratejobs.crypto import decrypt_secret
from ratejobs.models import ApiCredential, Call, Job

pytestmark = pytest.mark.django_db


def _url(api: Any, key: str = "") -> str:
    return f"/api/apis/{api.name}/credentials/" + (f"{key}/" if key else "")


def test_a_manager_adds_lists_replaces_and_deletes_keys_and_never_sees_a_secret(
    client_for, manager, api
):
    client = client_for(manager)
    # given one credential, then a list of three
    one = client.post(_url(api), {"key": "acme", "secret": "Bearer acme-1"}, format="json")
    many = client.post(
        _url(api),
        [{"key": f"c-{i}", "secret": f"Bearer s3cr3t-{i}"} for i in range(3)],
        format="json",
    )
    assert (one.status_code, one.json()) == (201, {"added": 1})
    assert (many.status_code, many.json()) == (201, {"added": 3})
    listed = client.get(_url(api))
    assert [c["key"] for c in listed.json()["results"]] == ["acme", "c-0", "c-1", "c-2"]
    assert [c["key"] for c in client.get(_url(api), {"search": "c-"}).json()["results"]] == [
        "c-0",
        "c-1",
        "c-2",
    ]
    # expect: stored encrypted, never in an answer
    stored = ApiCredential.objects.get(api=api, key="acme")
    assert "acme-1" not in stored.credential_encrypted
    assert decrypt_secret(stored.credential_encrypted) == "Bearer acme-1"
    replaced = client.put(_url(api, "acme"), {"secret": "Bearer acme-2"}, format="json")
    assert replaced.status_code == 200 and set(replaced.json()) == {"key", "created"}
    stored.refresh_from_db()
    assert decrypt_secret(stored.credential_encrypted) == "Bearer acme-2"
    for response in (one, many, listed, replaced):
        assert b"s3cr3t" not in response.content and b"acme-" not in response.content
    assert client.delete(_url(api, "acme")).status_code == 204
    assert client.delete(_url(api, "acme")).status_code == 404
    assert client.put(_url(api, "nobody"), {"secret": "x"}, format="json").status_code == 404


def test_a_bulk_add_with_one_bad_item_stores_nothing(client_for, manager, api):
    client = client_for(manager)
    client.post(_url(api), {"key": "taken", "secret": "x"}, format="json")
    for body in (
        [{"key": "fine", "secret": "x"}, {"key": "bad:key", "secret": "x"}],
        [{"key": "fine", "secret": "x"}, {"key": "fine", "secret": "y"}],
        [{"key": "fine", "secret": "x"}, {"key": "taken", "secret": "y"}],
        [{"key": "fine", "secret": "line\r\nbreak"}],
        [{"key": "fine", "secret": "x", "extra": 1}],
        [],
    ):
        response = client.post(_url(api), body, format="json")
        assert response.status_code == 400, (body, response.content)
    assert list(ApiCredential.objects.filter(api=api).values_list("key", flat=True)) == ["taken"]


def test_only_managers_touch_credentials(client_for, user, api):
    client = client_for(user)
    assert client.get(_url(api)).status_code == 403
    assert client.post(_url(api), {"key": "a", "secret": "x"}, format="json").status_code == 403
    assert client_for(None).get(_url(api)).status_code == 401


def test_a_job_naming_a_missing_key_is_400_listing_it_and_stores_nothing(client_for, manager, api):
    client = client_for(manager)
    client.post(_url(api), [{"key": "acme", "secret": "x"}], format="json")
    calls = [
        {"path": "/a", "credential_key": "acme"},
        {"path": "/b", "credential_key": "ghost-1"},
        {"path": "/c", "credential_key": "ghost-2"},
    ]
    response = client.post(
        "/api/jobs/", {"api": api.name, "name": "j", "calls": calls}, format="json"
    )
    assert response.status_code == 400
    assert "ghost-1, ghost-2" in response.json()["credential_key"][0]
    job_key = client.post(
        "/api/jobs/",
        {"api": api.name, "name": "j", "credential_key": "ghost", "calls": calls[:1]},
        format="json",
    )
    assert job_key.status_code == 400 and "ghost" in job_key.json()["credential_key"][0]
    bad_shape = client.post(
        "/api/jobs/",
        {"api": api.name, "name": "j", "calls": [{"path": "/a", "credential_key": "a:b"}]},
        format="json",
    )
    assert bad_shape.status_code == 400
    assert Job.objects.count() == 0 and Call.objects.count() == 0


def test_a_job_and_its_calls_carry_their_keys_in_rest_and_the_results(client_for, manager, api):
    client = client_for(manager)
    client.post(
        _url(api), [{"key": "acme", "secret": "x"}, {"key": "globex", "secret": "y"}], format="json"
    )
    calls = [{"path": "/a"}, {"path": "/b", "credential_key": "globex"}]
    created = client.post(
        "/api/jobs/",
        {"api": api.name, "name": "j", "credential_key": "acme", "calls": calls},
        format="json",
    )
    assert created.status_code == 201, created.content
    job = created.json()
    assert job["credential_key"] == "acme"
    listed = client.get(f"/api/jobs/{job['id']}/calls/").json()["results"]
    assert [c["credential_key"] for c in listed] == ["", "globex"]
    upload = client.generic(
        "POST",
        f"/api/jobs/upload/?api={api.name}&name=u&credential_key=globex",
        b'{"path": "/a"}\n{"path": "/b", "credential_key": "acme"}\n',
        content_type="application/x-ndjson",
    )
    assert upload.status_code == 201, upload.content
    assert upload.json()["credential_key"] == "globex"
    csv = client.get(f"/api/jobs/{job['id']}/results.csv").getvalue().decode()
    rows = list(DictReader(io.StringIO(csv)))
    assert [row["credential_key"] for row in rows] == ["acme", "globex"]
