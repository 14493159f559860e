"""Submitting a job from the admin: a file of calls or a path template; all or nothing."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from ratejobs.models import Call, Job

ADD_URL = reverse("admin:ratejobs_job_add")


def submit(client, api, **fields):
    return client.post(ADD_URL, {"api": api.pk, "name": "from the admin", "priority": 1, **fields})


def test_the_submit_page_offers_a_file_and_a_template(root_client, api):
    page = root_client.get(ADD_URL)
    assert page.status_code == 200
    html = page.content.decode()
    for field in ("calls_file", "path_template", "values", "api", "not_before", "deadline"):
        assert f'name="{field}"' in html


def test_a_path_template_with_values_makes_one_call_per_value(root_client, api):
    response = submit(
        root_client, api, method="GET", path_template="/users/{id}", values="1\n2\n\n3 \na/b\n"
    )
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:ratejobs_job_change", args=[job.pk])
    assert job.total == 4
    assert list(job.calls.order_by("index").values_list("path", flat=True)) == [
        "/users/1",
        "/users/2",
        "/users/3",
        "/users/a%2Fb",
    ]


def test_a_jsonl_file_makes_its_calls(root_client, api):
    lines = [
        {"method": "POST", "path": "/items", "json": {"n": 1}},
        {"path": "/items/2", "query": {"q": "x"}, "headers": {"X-Trace": "t"}},
    ]
    upload = SimpleUploadedFile(
        "calls.jsonl", "\n".join(json.dumps(line) for line in lines).encode()
    )
    response = submit(root_client, api, calls_file=upload)
    assert response.status_code == 302
    calls = list(Call.objects.order_by("index"))
    assert [(c.method, c.path, c.json, c.query, c.headers) for c in calls] == [
        ("POST", "/items", {"n": 1}, None, None),
        ("GET", "/items/2", None, {"q": "x"}, {"X-Trace": "t"}),
    ]


def test_a_csv_file_makes_its_calls(root_client, api):
    upload = SimpleUploadedFile(
        "calls.csv", b'method,path,query,json\nGET,/a,x=1&x=2,\nPUT,/b,,"{""k"": true}"\n'
    )
    response = submit(root_client, api, calls_file=upload)
    assert response.status_code == 302
    calls = list(Call.objects.order_by("index"))
    assert [(c.method, c.path, c.query, c.json) for c in calls] == [
        ("GET", "/a", {"x": ["1", "2"]}, None),
        ("PUT", "/b", None, {"k": True}),
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "Give a calls file, or a path template with values."),
        ({"path_template": "/users/{id}"}, "A path template needs values"),
        ({"path_template": "/u/{a}/{b}", "values": "1"}, "placeholder"),
        ({"path_template": "http://evil.example/{id}", "values": "1"}, "line 1: path"),
    ],
)
def test_bad_input_is_shown_on_the_form_and_nothing_is_stored(root_client, api, fields, message):
    response = submit(root_client, api, **fields)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert (Job.objects.count(), Call.objects.count()) == (0, 0)


def test_a_call_the_service_refuses_is_named_by_its_line_in_the_file(root_client, api):
    # given a CSV whose 4th line (3rd call, after a blank line) has a path that climbs out
    upload = SimpleUploadedFile("calls.csv", b"method,path\nGET,/a\n\nGET,/../admin\nGET,/b\n")
    response = submit(root_client, api, calls_file=upload)
    html = response.content.decode()
    assert "line 4: path" in html and "call 1" not in html
    assert (Job.objects.count(), Call.objects.count()) == (0, 0)


def test_a_file_with_a_bad_line_far_down_stores_nothing(root_client, api):
    # given 5,000 good calls and then one that is not JSON
    good = "".join(json.dumps({"path": f"/items/{i}"}) + "\n" for i in range(5000))
    upload = SimpleUploadedFile("calls.jsonl", (good + "{oops\n").encode())
    response = submit(root_client, api, calls_file=upload)
    # expect: the line is named, and neither the job nor its first batches were kept
    assert response.status_code == 200
    assert "line 5001" in response.content.decode()
    assert (Job.objects.count(), Call.objects.count()) == (0, 0)


def test_a_file_and_a_template_together_are_refused(root_client, api):
    upload = SimpleUploadedFile("calls.jsonl", b'{"path": "/a"}\n')
    response = submit(root_client, api, calls_file=upload, path_template="/b/{x}", values="1")
    assert "not both" in response.content.decode()
    assert Job.objects.count() == 0


def test_an_unknown_file_type_is_refused(root_client, api):
    upload = SimpleUploadedFile("calls.xlsx", b"PK\x03\x04")
    response = submit(root_client, api, calls_file=upload)
    assert "unsupported file type" in response.content.decode()
    assert Job.objects.count() == 0


def test_a_deadline_already_passed_is_shown_under_its_field(root_client, api):
    response = submit(
        root_client, api, method="GET", path_template="/users/{id}", values="1",
        deadline="2001-01-01 00:00:00",
    )  # fmt: skip
    assert response.status_code == 200
    assert response.context["form"].errors["deadline"] == ["the deadline has passed already"]
    assert not Job.objects.exists()
