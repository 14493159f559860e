"""Several limits per API and call cost through the REST API: windows read and written with
per-item errors, the live state of each window, a call's cost checked against the API's cost
windows and shown with what it used."""

from __future__ import annotations

import pytest

from ratejobs.limiter.config import MAX_WINDOWS
from ratejobs.models import Api, Call
from tests.rest.test_apis import api_payload
from tests.rest.test_jobs import counts, job_payload

HOURLY_AND_DAILY = [
    {"rate": 1000, "period": 3600, "burst": 100},
    {"rate": 10000, "period": 86400, "burst": 1000},
]
TOKENS = {"rate": 90000, "period": 60, "burst": 9000, "unit": "cost"}


def test_a_manager_creates_an_api_with_several_limits_and_each_window_shows_live(
    client_for, manager, unique_name, django_capture_on_commit_callbacks
):
    payload = api_payload(
        unique_name,
        limits=[*HOURLY_AND_DAILY, TOKENS],
        cost_header="X-Tokens-Used",
        cost_json_field="usage.total_tokens",
    )
    with django_capture_on_commit_callbacks(execute=True):  # the limiter is configured on commit
        created = client_for(manager).post("/api/apis/", payload, format="json")
    assert created.status_code == 201, created.json()
    body = client_for(manager).get(f"/api/apis/{unique_name}/").json()
    # expect: the limits stored canonical (with their unit), the cost fields, and one live
    # window state per limit, full at first
    assert body["limits"] == [
        {"rate": 1000.0, "period": 3600.0, "burst": 100, "unit": "requests"},
        {"rate": 10000.0, "period": 86400.0, "burst": 1000, "unit": "requests"},
        {"rate": 90000.0, "period": 60.0, "burst": 9000, "unit": "cost"},
    ]
    assert (body["cost_header"], body["cost_json_field"]) == ("X-Tokens-Used", "usage.total_tokens")
    windows = body["limiter"]["windows"]
    assert [w["label"] for w in windows] == ["1000/3600s", "10000/86400s", "90000 cost/60s"]
    assert [w["remaining"] for w in windows] == [100, 1000, 9000]
    assert all(w["full_in"] == 0 for w in windows)
    api = Api.objects.get(name=unique_name)
    assert [w.label for w in api.limiter_config().windows] == [w["label"] for w in windows]


def test_changing_the_limits_bumps_the_limits_version_and_reaches_the_limiter(
    client_for, manager, make_api, django_capture_on_commit_callbacks
):
    api = make_api()
    before = api.limits_version
    client = client_for(manager)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.patch(f"/api/apis/{api.name}/", {"limits": [TOKENS]}, format="json")
    assert response.status_code == 200, response.json()
    api.refresh_from_db()
    assert api.limits_version == before + 1
    windows = client.get(f"/api/apis/{api.name}/").json()["limiter"]["windows"]
    assert [w["label"] for w in windows] == ["90000 cost/60s"]
    # the same limits again change nothing; an empty list removes them
    client.patch(f"/api/apis/{api.name}/", {"limits": [TOKENS]}, format="json")
    api.refresh_from_db()
    assert api.limits_version == before + 1
    response = client.patch(f"/api/apis/{api.name}/", {"limits": []}, format="json")
    assert response.status_code == 200 and response.json()["limits"] == []
    api.refresh_from_db()
    assert api.limits_version == before + 2 and api.limits == []


@pytest.mark.parametrize(
    "limits, where",
    [
        ([{"rate": 10, "period": 60, "burst": 5}, {"rate": 10, "period": 0, "burst": 5}], "1"),
        ([{"rate": 10, "period": 60}], "0"),  # burst missing
        ([{"rate": 10, "period": 60, "burst": 5, "unit": "tokens"}], "0"),
        ([{"rate": 10, "period": 60, "burst": 5, "per": "key"}], "0"),
        ([{"rate": "10", "period": 60, "burst": 5}], "0"),  # a string is not a number
        (["10/60s"], "0"),
    ],
)
def test_a_bad_window_is_400_naming_it_and_nothing_changes(
    client_for, manager, make_api, limits, where
):
    api = make_api()
    response = client_for(manager).patch(
        f"/api/apis/{api.name}/", {"limits": limits}, format="json"
    )
    assert response.status_code == 400
    assert where in response.json()["limits"], response.json()
    api.refresh_from_db()
    assert api.limits == []


def test_more_windows_than_the_limiter_carries_is_400(client_for, manager, make_api):
    api = make_api()
    limits = [{"rate": n + 1, "period": 60, "burst": 1} for n in range(MAX_WINDOWS + 1)]
    response = client_for(manager).patch(
        f"/api/apis/{api.name}/", {"limits": limits}, format="json"
    )
    assert response.status_code == 400 and "limits" in response.json()


def test_window_errors_the_service_finds_name_the_window_and_its_field(
    client_for, manager, make_api
):
    # given windows of the right JSON types that only the limiter's bounds refuse
    api = make_api()
    limits = [
        {"rate": 10, "period": 60, "burst": 5},
        {"rate": 1e-6, "period": 366 * 86400, "burst": 1},  # slower than one per leap year
        {"rate": 10, "period": 60, "burst": 7},  # the same window as the first
    ]
    response = client_for(manager).patch(
        f"/api/apis/{api.name}/", {"limits": limits}, format="json"
    )
    assert response.status_code == 400
    messages = response.json()["limits"]
    assert any(m.startswith("limits[1]: period / rate must be") for m in messages), messages
    assert "limits[2]: the same rate, period and unit as limits[0]" in messages


@pytest.mark.parametrize(
    "field, value",
    [("cost_header", "X Tokens"), ("cost_header", "X-Tokens:"), ("cost_json_field", "usage..n"),
     ("cost_json_field", "usage/total")],
)  # fmt: skip
def test_a_bad_cost_header_or_json_field_is_400(client_for, manager, make_api, field, value):
    api = make_api()
    response = client_for(manager).patch(f"/api/apis/{api.name}/", {field: value}, format="json")
    assert response.status_code == 400 and field in response.json()


# -- a call's cost ---------------------------------------------------------------------------


def test_calls_carry_their_cost_and_one_above_the_smallest_cost_burst_is_400_by_index(
    api_client, make_api, user
):
    api = make_api(limits=[TOKENS, {**TOKENS, "rate": 1000, "burst": 500}])
    calls = [{"path": "/a", "cost": 120}, {"path": "/b"}, {"path": "/c", "cost": 501}]
    response = api_client.post("/api/jobs/", job_payload(api.name, calls), format="json")
    # expect: the call over the smallest burst (500) is named, and nothing is stored
    assert response.status_code == 400
    assert "cost" in response.json()["calls"]["2"], response.json()
    assert "500" in response.json()["calls"]["2"]["cost"][0]
    assert counts(user) == (0, 0)

    calls[2]["cost"] = 500
    response = api_client.post("/api/jobs/", job_payload(api.name, calls), format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    stored = list(
        Call.objects.filter(job_id=job_id).order_by("index").values_list("cost", flat=True)
    )
    assert stored == [120, 0, 500]
    listed = api_client.get(f"/api/jobs/{job_id}/calls/").json()["results"]
    assert [(c["cost"], c["cost_used"]) for c in listed] == [(120, None), (0, None), (500, None)]


@pytest.mark.parametrize("cost", [-1, 1.5, "7", True, None])
def test_a_cost_that_is_not_a_whole_number_is_400(api_client, make_api, user, cost):
    api = make_api()
    calls = [{"path": "/a", "cost": cost}]
    response = api_client.post("/api/jobs/", job_payload(api.name, calls), format="json")
    assert response.status_code == 400 and "cost" in response.json()["calls"]["0"]
    assert counts(user) == (0, 0)


def test_an_upload_reads_each_line_s_cost(api_client, make_api, user):
    api = make_api(limits=[TOKENS])
    lines = b'{"path": "/a", "cost": 30}\n{"path": "/b"}\n{"path": "/c", "cost": 9001}\n'
    response = api_client.post(
        f"/api/jobs/upload/?api={api.name}&name=up", lines, content_type="application/x-ndjson"
    )
    assert response.status_code == 400
    assert "cost" in response.json()["lines"]["3"], response.json()
    response = api_client.post(
        f"/api/jobs/upload/?api={api.name}&name=up", lines.replace(b"9001", b"9000"),
        content_type="application/x-ndjson",
    )  # fmt: skip
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    stored = list(
        Call.objects.filter(job_id=job_id).order_by("index").values_list("cost", flat=True)
    )
    assert stored == [30, 0, 9000]


def test_the_schema_documents_limits_cost_and_their_bounds(api_client):
    schema = api_client.get("/api/schema/?format=json").json()["components"]["schemas"]
    update = schema["PatchedApiUpdateInput"]["properties"]
    assert update["limits"]["maxItems"] == MAX_WINDOWS
    window = schema["Window"]
    assert window["additionalProperties"] is False
    assert window["properties"]["burst"]["minimum"] == 1
    assert window["properties"]["rate"]["maximum"] == 1_000_000
    for field in ("cost_header", "cost_json_field"):  # the pattern, or empty for none
        assert ["pattern" in choice for choice in update[field]["oneOf"]] == [True, False]
    call_spec = schema["CallSpec"]
    assert call_spec["properties"]["cost"]["minimum"] == 0
    call = schema["CallOutput"]["properties"]
    assert call["cost_used"]["nullable"] is True and call["cost"]["maximum"] == 1_000_000_000
    state = schema["WindowState"]["properties"]
    assert {"label", "remaining", "next_free_in", "full_in"} <= set(state)
