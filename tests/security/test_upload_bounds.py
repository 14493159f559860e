"""What a bad file costs to refuse is bounded, whatever its lines are: a
million unreadable lines are read only as far as the error budget, and a line or a CSV
cell nested 400 levels deep is a line error, not a 500. Replayed through gunicorn as an
attacker would send them, and through the admin's submit page."""

from __future__ import annotations

import time

import pytest
import requests
from django.contrib.auth.hashers import PBKDF2PasswordHasher, make_password
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from rest_framework.authtoken.models import Token

from ratejobs.json_limits import MAX_JSON_DEPTH
from ratejobs.models import Job
from ratejobs.uploads import MAX_LINES_READ_AFTER_AN_ERROR
from tests.rest.realserver import web_server  # noqa: F401 (fixture)

NDJSON = "application/x-ndjson"
DEEP = 400  # the report's depth: json.loads and the job service's walk both recursed past it


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_an_upload_of_a_million_unreadable_lines_is_read_only_to_the_error_budget(
    web_server,  # noqa: F811
    django_user_model,
    make_api,
):
    person = django_user_model.objects.create(username="prober", password=make_password(
        "prober-password", hasher=PBKDF2PasswordHasher()))  # fmt: skip
    token = Token.objects.create(user=person).key
    server = web_server()
    url = f"{server.url}/api/jobs/upload/?api={make_api().name}&name=x"
    headers = {"Authorization": f"Token {token}", "Content-Type": NDJSON}
    # when: a million lines of "x" (2 MB), then the same with a line nested 400 deep first
    started = time.perf_counter()
    refused = requests.post(url, b"x\n" * 1_000_000, headers=headers, timeout=300)
    elapsed = time.perf_counter() - started
    deep = requests.post(url, f'{{"path": "/a", "json": {nested(DEEP)}}}\n'.encode() +
                         b'{"path": "/b"}\n', headers=headers, timeout=60)  # fmt: skip
    # expect: 400s naming the lines, the first stopped at the budget ("at least"), nothing
    # stored
    assert refused.status_code == 400, refused.text[:300]
    assert refused.json()["error_count"] == {
        "total": MAX_LINES_READ_AFTER_AN_ERROR + 1,
        "exact": False,
    }
    print(f"\na million unreadable lines refused in {elapsed:.2f} s")
    assert deep.status_code == 400, deep.text[:300]
    assert deep.json()["lines"] == {
        "1": {"non_field_errors": [f"JSON nested too deep: at most {MAX_JSON_DEPTH} levels"]}
    }
    assert not Job.objects.filter(owner=person).exists()


@pytest.mark.parametrize(
    ("depth", "refused"), [(MAX_JSON_DEPTH - 1, False), (MAX_JSON_DEPTH, True), (DEEP, True)]
)
def test_the_same_depth_cap_holds_for_json_lines_csv_cells_and_json_bodies(
    client_for, user, api, admin_client_for, superuser, depth, refused
):
    # a call's own object is level 1: its json field's value starts at level 2
    body_value = nested(depth)
    client = client_for(user)
    as_json = client.post("/api/jobs/", {"api": api.name, "name": "j", "calls": [
        {"path": "/a", "json": __import__("json").loads(body_value)}]}, format="json") \
        if depth < 500 else None  # fmt: skip
    line = f'{{"path": "/a", "json": {body_value}}}\n'.encode()
    as_line = client.generic("POST", f"/api/jobs/upload/?api={api.name}&name=l", line,
                             content_type=NDJSON)  # fmt: skip
    csv = f'path,json\n/a,"{body_value}"\n'.encode()
    as_cell = admin_client_for(superuser).post(reverse("admin:ratejobs_job_add"), {
        "api": api.pk, "name": "c", "priority": 1,
        "calls_file": SimpleUploadedFile("calls.csv", csv)})  # fmt: skip
    if refused:
        assert as_json is None or as_json.status_code == 400
        assert as_line.status_code == 400
        assert as_cell.status_code == 200
        assert "nested too deep" in as_cell.content.decode()
    else:
        assert as_json.status_code == 201, as_json.content[:300]
        assert as_line.status_code == 201, as_line.content[:300]
        assert as_cell.status_code == 302


def test_the_admins_csv_of_a_million_bad_rows_counts_to_the_budget(
    admin_client_for, superuser, api
):
    csv = b"path\n" + b"a,b\n" * 1_000_000  # two cells for one column: no call at all
    page = admin_client_for(superuser).post(reverse("admin:ratejobs_job_add"), {
        "api": api.pk, "name": "c", "priority": 1,
        "calls_file": SimpleUploadedFile("calls.csv", csv)})  # fmt: skip
    assert page.status_code == 200
    assert f"and at least {MAX_LINES_READ_AFTER_AN_ERROR + 1 - 20:,} more errors" in (
        page.content.decode()
    )
