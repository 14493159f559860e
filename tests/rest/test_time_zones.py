"""A job's not_before and deadline must say their time zone: a time without one is a 400 that
says to add Z or an offset, never read as UTC (REST JSON and the upload's query parameters; an
offset's `+` that a query string turned into a space is named as such)."""

from __future__ import annotations

from typing import Any

import pytest

from ratejobs.models import Job

NDJSON = "application/x-ndjson"
CALLS = [{"path": "/a"}]


def create(client: Any, api_name: str, **fields: Any) -> Any:
    body = {"api": api_name, "name": "zoned", "calls": CALLS, **fields}
    return client.post("/api/jobs/", body, format="json")


def upload(client: Any, api_name: str, query: str) -> Any:
    return client.generic(
        "POST", f"/api/jobs/upload/?api={api_name}&name=zoned&{query}", b'{"path": "/a"}\n',
        content_type=NDJSON,
    )  # fmt: skip


@pytest.mark.parametrize("field", ["not_before", "deadline"])
def test_a_time_without_a_zone_is_a_400_that_says_to_add_one(api_client, api, field):
    for response in (
        create(api_client, api.name, **{field: "2099-12-01T08:00:00"}),
        upload(api_client, api.name, f"{field}=2099-12-01T08:00:00"),
    ):
        assert response.status_code == 400, response.content
        (message,) = response.json()[field]
        assert message.startswith("This time has no time zone: add Z for UTC or an offset")
    assert Job.objects.count() == 0


def test_a_time_with_z_or_an_offset_is_taken_at_that_moment(api_client, api):
    made = create(api_client, api.name, not_before="2099-12-01T08:00:00+02:00",
                  deadline="2099-12-02T08:00:00Z")  # fmt: skip
    assert made.status_code == 201, made.content
    job = Job.objects.get(pk=made.json()["id"])
    assert job.not_before.isoformat() == "2099-12-01T06:00:00+00:00"
    uploaded = upload(api_client, api.name, "not_before=2099-12-01T08:00:00%2B02:00")
    assert uploaded.status_code == 201, uploaded.content
    assert Job.objects.get(pk=uploaded.json()["id"]).not_before == job.not_before


def test_an_offset_whose_plus_a_query_string_made_a_space_is_named(api_client, api):
    response = upload(api_client, api.name, "not_before=2099-12-01T08:00:00+02:00")
    assert response.status_code == 400
    assert "%2B" in response.json()["not_before"][0]
    # a minus needs no escaping
    assert upload(api_client, api.name, "not_before=2099-12-01T08:00:00-02:00").status_code == 201
