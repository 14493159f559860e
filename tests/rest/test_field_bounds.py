"""A call's text longer than its column holds is refused by the job service, naming the field
and its limit, on every way in (REST, upload, admin, command line): never a PostgreSQL
DataError (a 500) or, on SQLite, a value stored past its column's length.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.urls import reverse

from ratejobs.models import Call, Job
from ratejobs.services.callbacks import signing_key_rotate

PATH_MAX = Call._meta.get_field("path").max_length  # 2000
NDJSON = "application/x-ndjson"


def path_of(length: int) -> str:
    return "/" + "p" * (length - 1)


def stored(owner: Any) -> tuple[int, int]:
    return Job.objects.filter(owner=owner).count(), Call.objects.filter(job__owner=owner).count()


def test_a_path_as_long_as_its_column_is_stored_whole(api_client, api, user):
    calls = [{"path": path_of(PATH_MAX)}]
    response = api_client.post(
        "/api/jobs/", {"api": api.name, "name": "edge", "calls": calls}, format="json"
    )
    assert response.status_code == 201, response.content[:300]
    assert Call.objects.get(job__owner=user).path == path_of(PATH_MAX)


@pytest.mark.parametrize("length", [PATH_MAX + 1, 5001])
def test_a_longer_path_is_400_naming_the_call_the_field_and_the_limit(
    api_client, api, user, length
):
    # given: a good call, then one whose path is over the column's 2000 characters
    calls = [{"path": "/fine"}, {"path": path_of(length)}]
    response = api_client.post(
        "/api/jobs/", {"api": api.name, "name": "long", "calls": calls}, format="json"
    )
    assert response.status_code == 400, response.content[:300]
    refusal = f"at most {PATH_MAX:,} characters (it has {length:,})"
    assert response.json()["calls"] == {"1": {"path": [refusal]}}
    assert stored(user) == (0, 0)


def test_an_upload_line_with_a_longer_path_is_400_by_line(api_client, api, user):
    body = (json.dumps({"path": "/fine"}) + "\n" + json.dumps({"path": path_of(5001)})).encode()
    response = api_client.generic(
        "POST", f"/api/jobs/upload/?api={api.name}&name=long", body, content_type=NDJSON
    )
    assert response.status_code == 400, response.content[:300]
    refusal = f"at most {PATH_MAX:,} characters (it has 5,001)"
    assert response.json()["lines"] == {"2": {"path": [refusal]}}
    assert stored(user) == (0, 0)


def test_the_submit_job_command_refuses_a_longer_path_and_stores_nothing(api, superuser, tmp_path):
    calls = tmp_path / "calls.jsonl"
    calls.write_text(json.dumps({"path": path_of(5001)}) + "\n")
    with pytest.raises(CommandError) as refused:
        call_command(
            "submit_job", "--api", api.name, "--owner", superuser.username, "--file", str(calls),
            stdout=io.StringIO(), stderr=io.StringIO(),
        )  # fmt: skip
    message = str(refused.value)
    assert f"path: at most {PATH_MAX:,} characters (it has 5,001)" in message, message
    assert stored(superuser) == (0, 0)


def test_the_admin_submit_page_refuses_a_longer_path_and_stores_nothing(
    admin_client_for, superuser, api
):
    upload = SimpleUploadedFile("calls.jsonl", json.dumps({"path": path_of(5001)}).encode())
    response = admin_client_for(superuser).post(
        reverse("admin:ratejobs_job_add"),
        {"api": api.pk, "name": "long", "priority": 1, "calls_file": upload},
    )
    assert response.status_code == 200  # the form again, with its errors
    assert f"at most {PATH_MAX:,} characters" in response.content.decode()
    assert stored(superuser) == (0, 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "n" * 201),
        ("callback_url", "https://example.com/" + "c" * 2000),
        ("credential_key", "k" * 101),
    ],
)
def test_a_job_field_longer_than_its_column_is_400_naming_it(api_client, api, user, field, value):
    payload = {"api": api.name, "name": "job", "calls": [{"path": "/a"}], field: value}
    response = api_client.post("/api/jobs/", payload, format="json")
    assert response.status_code == 400, response.content[:300]
    assert field in response.json()
    assert stored(user) == (0, 0)


@pytest.mark.parametrize(
    ("option", "value", "field", "limit"),
    [
        ("--name", "n" * 201, "name", 200),
        ("--callback-url", "http://127.0.0.1/" + "c" * 2000, "callback_url", 2000),
    ],
)
def test_the_submit_job_command_refuses_a_job_field_longer_than_its_column(
    api, superuser, tmp_path, option, value, field, limit
):
    signing_key_rotate(user=superuser)  # a callback needs one, or that is the refusal
    calls = tmp_path / "calls.jsonl"
    calls.write_text(json.dumps({"path": "/a"}) + "\n")
    with pytest.raises(CommandError) as refused:
        call_command(
            "submit_job", "--api", api.name, "--owner", superuser.username, "--file", str(calls),
            option, value, stdout=io.StringIO(), stderr=io.StringIO(),
        )  # fmt: skip
    message = str(refused.value)
    assert message.startswith(f"{field}: ") and f"at most {limit} characters" in message, message
    assert "nothing was stored" in message
    assert stored(superuser) == (0, 0)
