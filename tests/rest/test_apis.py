"""The /api/apis/ endpoints: managers create and change APIs; everyone signed in reads them with
their live limiter state; the credential never leaves the server."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from ratejobs.models import Api
from ratejobs.services.apis import api_block

CANARY = "canary-7f3a9c-secret-credential"


def api_payload(name: str, **fields: object) -> dict[str, object]:
    return {
        "name": name,
        "base_url": "https://api.example.com/v2",
        "rate": 5,
        "period": 1,
        "burst": 2,
        "max_concurrency": 4,
        "adaptive": True,
        "min_rate": 1,
        "max_attempts": 3,
        "max_throttled_retries": 10,
        "timeout": 5,
        "default_headers": {"Accept": "application/json"},
        "auth_header": "X-Api-Key",
        "credential_env": "",
        "credential": CANARY,
        **fields,
    }


def test_a_manager_creates_an_api_and_its_credential_never_appears_in_a_response(
    client_for, manager, user, unique_name
):
    manager_client, user_client = client_for(manager), client_for(user)
    responses = []

    created = manager_client.post("/api/apis/", api_payload(unique_name), format="json")
    responses.append(created)
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["name"] == unique_name
    assert body["has_credential"] is True
    assert "credential" not in body and "credential_encrypted" not in body
    assert body["rate"] == 5 and body["burst"] == 2 and body["auth_header"] == "X-Api-Key"
    stored = Api.objects.get(name=unique_name)
    assert stored.credential_encrypted and CANARY not in stored.credential_encrypted

    responses += [
        manager_client.get("/api/apis/"),
        manager_client.get(f"/api/apis/{unique_name}/"),
        user_client.get("/api/apis/"),
        user_client.get(f"/api/apis/{unique_name}/"),
        manager_client.patch(
            f"/api/apis/{unique_name}/", {"rate": 6, "credential": CANARY + "-2"}, format="json"
        ),
        user_client.post(
            "/api/jobs/",
            {"api": unique_name, "name": "j", "calls": [{"method": "GET", "path": "/x"}]},
            format="json",
        ),
    ]
    job_id = responses[-1].json()["id"]
    responses += [
        user_client.get("/api/jobs/"),
        user_client.get(f"/api/jobs/{job_id}/"),
        user_client.get(f"/api/jobs/{job_id}/calls/"),
        user_client.get(f"/api/jobs/{job_id}/events/"),
    ]
    assert [r.status_code for r in responses] == [201, 200, 200, 200, 200, 200, 201] + [200] * 4
    for response in responses:
        text = response.content.decode()
        assert CANARY not in text
        assert stored.credential_encrypted not in text
    listed = {a["name"]: a for a in responses[3].json()["results"]}
    assert listed[unique_name]["has_credential"] is True


def test_non_staff_may_read_apis_but_not_create_or_change_them(api_client, api, unique_name):
    assert api_client.get("/api/apis/").status_code == 200
    created = api_client.post("/api/apis/", api_payload(unique_name), format="json")
    assert created.status_code == 403
    changed = api_client.patch(f"/api/apis/{api.name}/", {"rate": 99}, format="json")
    assert changed.status_code == 403
    assert not Api.objects.filter(name=unique_name).exists()
    api.refresh_from_db()
    assert api.rate == 10


def test_anonymous_requests_are_refused_with_401(client_for, api):
    anonymous = client_for(None)
    assert anonymous.get("/api/apis/").status_code == 401
    assert anonymous.get("/api/jobs/").status_code == 401
    assert anonymous.post("/api/jobs/", {}, format="json").status_code == 401


@pytest.mark.parametrize(
    ("fields", "bad_field"),
    [
        ({"rate": 0}, "rate"),
        ({"rate": -1}, "rate"),
        ({"burst": 0}, "burst"),
        ({"period": 0}, "period"),
        ({"base_url": "not a url"}, "base_url"),
        ({"base_url": "ftp://files.example.com/"}, "base_url"),
        ({"base_url": "https://user:pw@api.example.com/"}, "base_url"),
        ({"rate": "fast"}, "rate"),
        ({"name": "not a slug!"}, "name"),
        ({"default_headers": ["Accept"]}, "default_headers"),
        ({"rat": 5}, "rat"),
    ],
)
def test_bad_api_values_are_400_with_field_errors_and_nothing_stored(
    client_for, manager, unique_name, fields, bad_field
):
    payload = {**api_payload(unique_name), **fields}
    response = client_for(manager).post("/api/apis/", payload, format="json")
    assert response.status_code == 400
    assert bad_field in response.json(), response.json()
    assert CANARY not in response.content.decode()
    assert not Api.objects.filter(name__startswith=unique_name).exists()


def test_a_duplicate_api_name_is_400(client_for, manager, api):
    response = client_for(manager).post("/api/apis/", api_payload(api.name), format="json")
    assert response.status_code == 400
    assert "name" in response.json()


def test_an_api_shows_its_live_limiter_state(api_client, api):
    api_block(api=api, seconds=30)

    body = api_client.get(f"/api/apis/{api.name}/").json()

    limiter = body["limiter"]
    assert body["limiter_error"] is None
    assert limiter["configured"] is True
    assert limiter["rate"] == limiter["current_rate"] == 10
    assert 25 < limiter["blocked_for"] <= 30
    assert limiter["in_flight"] == 0
    assert {"next_free_in", "generation", "burst", "period"} <= set(limiter)
    assert limiter["learned_rate"] is None  # nothing measured yet


def test_patch_changes_limits_live(client_for, manager, api, django_capture_on_commit_callbacks):
    manager_client = client_for(manager)
    with django_capture_on_commit_callbacks(execute=True):
        response = manager_client.patch(
            f"/api/apis/{api.name}/", {"rate": 7, "burst": 3}, format="json"
        )
    assert response.status_code == 200, response.json()
    assert response.json()["rate"] == 7

    limiter = manager_client.get(f"/api/apis/{api.name}/").json()["limiter"]
    assert (limiter["rate"], limiter["burst"]) == (7, 3)


@pytest.mark.parametrize(
    ("fields", "bad_field"),
    [({"name": "renamed"}, "name"), ({"burst": 0}, "burst"), ({"rate": -2}, "rate")],
)
def test_patch_refuses_bad_or_unchangeable_fields(client_for, manager, api, fields, bad_field):
    response = client_for(manager).patch(f"/api/apis/{api.name}/", fields, format="json")
    assert response.status_code == 400
    assert bad_field in response.json()
    unchanged = Api.objects.get(pk=api.pk)
    assert (unchanged.name, unchanged.rate, unchanged.burst) == (api.name, 10, 1)


def test_patch_with_an_empty_credential_removes_it(client_for, manager, api):
    response = client_for(manager).patch(
        f"/api/apis/{api.name}/", {"credential": ""}, format="json"
    )
    assert response.json()["has_credential"] is False


def test_unknown_api_is_404(api_client):
    assert api_client.get("/api/apis/no-such-api/").status_code == 404


def test_redis_down_gives_apis_with_a_null_limiter_not_a_500(api_client, api, redis_down):
    listing = api_client.get("/api/apis/")
    detail = api_client.get(f"/api/apis/{api.name}/")

    assert listing.status_code == detail.status_code == 200
    listed = {a["name"]: a for a in listing.json()["results"]}
    for body in (listed[api.name], detail.json()):
        assert body["name"] == api.name
        assert body["limiter"] is None
        assert "Redis" in body["limiter_error"]


def test_only_managers_see_default_header_values(client_for, user, staff, manager, make_api):
    api = make_api(default_headers={"X-Static-Key": "static-secret"})
    as_user = client_for(user).get(f"/api/apis/{api.name}/").json()
    as_staff = client_for(manager).get(f"/api/apis/{api.name}/").json()
    as_plain_staff = client_for(staff).get(f"/api/apis/{api.name}/").json()
    assert as_plain_staff["default_headers"] == {"X-Static-Key": "***"}
    assert as_user["default_headers"] == {"X-Static-Key": "***"}
    assert as_staff["default_headers"] == {"X-Static-Key": "static-secret"}


def test_token_auth_works_and_a_bad_token_is_401(client_for, user, api):
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.get("/api/apis/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    response = client.get("/api/apis/")
    assert response.status_code == 401
    assert json.loads(response.content)["detail"]


def test_an_api_created_or_changed_while_redis_is_down_is_saved(
    client_for, manager, unique_name, redis_down, django_capture_on_commit_callbacks
):
    # given: the limiter cannot be configured (Redis down) when the change commits;
    # expect: the API is saved all the same, and the response says why there is no limiter.
    manager_client = client_for(manager)
    with django_capture_on_commit_callbacks(execute=True):
        created = manager_client.post("/api/apis/", api_payload(unique_name), format="json")
    with django_capture_on_commit_callbacks(execute=True):
        changed = manager_client.patch(f"/api/apis/{unique_name}/", {"rate": 2}, format="json")

    assert (created.status_code, changed.status_code) == (201, 200)
    assert changed.json()["limiter"] is None and changed.json()["limiter_error"]
    assert Api.objects.get(name=unique_name).rate == 2
