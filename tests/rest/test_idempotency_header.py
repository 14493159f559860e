"""An API's idempotency_header through /api/apis/: shown, changed live, and refused (400 on that
field) where the header would be malformed, the connection's, the credential's or a default."""

from __future__ import annotations

import pytest

from ratejobs.execution.targets import HEADER_NAME_PATTERN
from ratejobs.models import Api
from tests.rest.test_apis import api_payload


def test_an_api_with_an_idempotency_header_shows_it_and_can_drop_it(
    client_for, manager, user, unique_name
):
    manager_client = client_for(manager)
    payload = api_payload(unique_name, idempotency_header="Idempotency-Key")
    created = manager_client.post("/api/apis/", payload, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["idempotency_header"] == "Idempotency-Key"
    read = client_for(user).get(f"/api/apis/{unique_name}/").json()
    assert read["idempotency_header"] == "Idempotency-Key"
    # and a job's representation carries the uuid its calls' keys start with
    job = client_for(user).post(
        "/api/jobs/", {"api": unique_name, "name": "j", "calls": [{"path": "/x"}]}, format="json"
    )
    assert len(job.json()["uuid"]) == 36
    dropped = manager_client.patch(
        f"/api/apis/{unique_name}/", {"idempotency_header": ""}, format="json"
    )
    assert dropped.status_code == 200, dropped.json()
    assert Api.objects.get(name=unique_name).idempotency_header == ""


def test_an_api_has_no_idempotency_header_unless_given(client_for, manager, unique_name):
    created = client_for(manager).post("/api/apis/", api_payload(unique_name), format="json")
    assert created.json()["idempotency_header"] == ""


@pytest.mark.parametrize(
    "name",
    [
        "Idempotency Key",  # not an HTTP token
        "Idempotency-Key:",
        "x" * 101,  # longer than the column
        "Host",
        "content-length",
        "Transfer-Encoding",
        "Connection",
        "Proxy-Authorization",
        "Cookie",
        "Authorization",
        "x-api-key",  # the payload's auth_header, in another case
        "accept",  # one of the payload's default_headers, in another case
    ],
)
def test_a_bad_idempotency_header_is_400_on_its_field(client_for, manager, unique_name, name):
    payload = api_payload(unique_name, idempotency_header=name)
    response = client_for(manager).post("/api/apis/", payload, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["idempotency_header"], response.json()
    assert not Api.objects.filter(name=unique_name).exists()


@pytest.mark.parametrize(
    "change",
    [
        {"auth_header": "Idempotency-Key"},
        {"default_headers": {"IDEMPOTENCY-KEY": "one-for-all"}},
        {"idempotency_header": "X-Api-Key"},
    ],
)
def test_a_change_that_makes_the_idempotency_header_clash_is_400(
    client_for, manager, unique_name, change
):
    # given an API whose idempotency header is fine
    manager_client = client_for(manager)
    payload = api_payload(unique_name, idempotency_header="Idempotency-Key")
    assert manager_client.post("/api/apis/", payload, format="json").status_code == 201
    # when another field changes to clash with it (or it with another field)
    response = manager_client.patch(f"/api/apis/{unique_name}/", change, format="json")
    # expect: a 400 on the idempotency header, and nothing changed
    assert response.status_code == 400
    assert "idempotency_header" in response.json(), response.json()
    stored = Api.objects.get(name=unique_name)
    assert (stored.auth_header, stored.idempotency_header) == ("X-Api-Key", "Idempotency-Key")
    assert stored.default_headers == {"Accept": "application/json"}


def test_the_schema_documents_the_idempotency_header_with_a_pattern(client_for):
    schema = client_for(None).get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    field = components["ApiCreateInput"]["properties"]["idempotency_header"]
    # a token, or empty for none
    assert [(b["pattern"], b["maxLength"]) for b in field["oneOf"] if "pattern" in b] == [
        (HEADER_NAME_PATTERN, 100)
    ]
    assert {"type": "string", "maxLength": 0} in field["oneOf"]
    assert "idempotency_header" in components["ApiOutput"]["properties"]
    assert components["JobOutput"]["properties"]["uuid"]["readOnly"] is True
