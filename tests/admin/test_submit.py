"""Submitting a job from the admin: a file of calls or a path template; all or nothing."""

from __future__ import annotations

import json

import pytest
from django.contrib.staticfiles import finders
from django.core.files.uploadedfile import SimpleUploadedFile
from django.templatetags.static import static
from django.urls import reverse

from devtools import devredis
from ratejobs.models import Call, Job
from ratejobs.uploads import CSV_COLUMNS

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


# -- every error of a file, the form kept between tries, samples -----------------------------


def errors_of(response, field: str = "calls_file") -> list[str]:
    return response.context["form"].errors[field]


# Three mistakes in each: a line that cannot be read, a path that climbs out, a method that
# is none, so the reader's errors and the job service's are listed together.
THREE_MISTAKES = {
    "csv": ("calls.csv", b"path,method,json\n/a,GET,{oops\n/../x,GET,\n/c,BREW,\n"),
    "jsonl": ("calls.jsonl", b'{oops\n{"path": "/../x"}\n{"path": "/c", "method": "BREW"}\n'),
}


@pytest.mark.parametrize(
    ("source", "lines"),
    [("csv", [2, 3, 4]), ("jsonl", [1, 2, 3]), ("values", [1, 2, 4])],
)
def test_every_error_of_a_file_is_listed_by_line(root_client, api, source, lines):
    if source == "values":  # a template that leaves the API: each value's call is refused
        fields, field = (
            {"path_template": "https://evil.example/{id}", "values": "1\n2\n\n3"},
            source,
        )
    else:
        fields, field = {"calls_file": SimpleUploadedFile(*THREE_MISTAKES[source])}, "calls_file"
    response = submit(root_client, api, **fields)
    # expect: the three errors, each named by its line, in line order; nothing stored
    errors = errors_of(response, field)
    assert [message.split(":")[0] for message in errors] == [f"line {n}" for n in lines]
    assert (Job.objects.count(), Call.objects.count()) == (0, 0)


def test_past_twenty_errors_the_rest_are_counted(root_client, api):
    # given 30 bad calls and 5 lines that are not JSON, among good ones
    lines = [json.dumps({"path": f"/items/{i}"}) for i in range(10)]
    lines += [json.dumps({"path": "/../x"})] * 30 + ["{oops"] * 5
    upload = SimpleUploadedFile("calls.jsonl", "\n".join(lines).encode())
    errors = errors_of(submit(root_client, api, calls_file=upload))
    # expect: 20 errors by line (from line 11), then the count of the other 15
    assert len(errors) == 21
    assert errors[0].startswith("line 11: path") and errors[19].startswith("line 30: path")
    assert errors[-1] == "and 15 more errors"


def test_the_form_keeps_its_values_and_the_file_after_an_error(root_client, api):
    # given a try refused for its priority, with a file chosen and the other fields filled
    upload = SimpleUploadedFile("calls.csv", b"path\n/a\n/b\n")
    first = root_client.post(ADD_URL, {
        "api": api.pk, "name": "kept job", "priority": 0, "callback_url": "",
        "credential_key": "", "calls_file": upload, "not_before": "2031-01-02 03:04:05",
    })  # fmt: skip
    html = first.content.decode()
    # expect: the values shown again, and the file offered from the last try
    assert 'value="kept job"' in html and 'value="0"' in html
    assert 'value="2031-01-02 03:04:05"' in html
    assert "Using <strong>calls.csv</strong> (11\xa0bytes) from your last try" in html
    token = first.context["form"].kept.token
    assert f'name="kept_upload" value="{token}"' in html
    # and the next try without a file uses the kept one
    second = root_client.post(
        ADD_URL, {"api": api.pk, "name": "kept job", "priority": 2, "kept_upload": token}
    )
    assert second.status_code == 302
    job = Job.objects.get()
    assert (job.name, job.priority, job.total) == ("kept job", 2, 2)
    # once used, it is gone
    third = root_client.post(
        ADD_URL, {"api": api.pk, "name": "again", "priority": 1, "kept_upload": token}
    )
    assert "kept for an hour only" in third.content.decode()


def test_a_kept_file_is_only_its_senders_and_may_be_dropped(root_client, api, admin_client_for,
                                                            django_user_model):  # fmt: skip
    upload = SimpleUploadedFile("calls.jsonl", b'{"path": "/a"}\n')
    token = submit(root_client, api, calls_file=upload, priority=0).context["form"].kept.token
    other = admin_client_for(django_user_model.objects.create_superuser("root2", password="x"))
    stolen = submit(other, api, kept_upload=token)
    assert "kept for an hour only" in stolen.content.decode()
    # dropping it lets a path template be used instead
    dropped = submit(root_client, api, kept_upload=token, kept_upload_drop="on",
                     path_template="/u/{id}", values="1")  # fmt: skip
    assert dropped.status_code == 302
    assert Job.objects.get().calls.get().path == "/u/1"


def test_a_new_file_replaces_the_kept_one(root_client, api):
    upload = SimpleUploadedFile("first.csv", b"path\n/a\n")
    token = submit(root_client, api, calls_file=upload, priority=0).context["form"].kept.token
    upload = SimpleUploadedFile("second.csv", b"path\n/b\n/c\n")
    response = submit(root_client, api, calls_file=upload, kept_upload=token)
    assert response.status_code == 302
    assert Job.objects.get().total == 2


@pytest.mark.parametrize("name", ["calls.csv", "calls.jsonl"])
def test_the_samples_are_linked_explained_and_submit_cleanly(root_client, api, name):
    page = root_client.get(ADD_URL).content.decode()
    url = static(f"ratejobs/samples/{name}")
    assert f'href="{url}" download' in page
    for column in CSV_COLUMNS:
        assert f"<code>{column}</code>" in page
    assert static("ratejobs/submit.js") in page and 'id="calls-file-count"' in page
    with open(finders.find(f"ratejobs/samples/{name}"), "rb") as sample:
        response = submit(root_client, api, calls_file=SimpleUploadedFile(name, sample.read()))
    assert response.status_code == 302, response.context["form"].errors
    calls = list(Job.objects.get().calls.order_by("index").values_list("method", "path", "body"))
    assert calls == [
        ("GET", "/items/1", None), ("GET", "/items", None), ("POST", "/items", None),
        ("PUT", "/items/4", "a text body\non two lines"), ("DELETE", "/items/5", None),
    ]  # fmt: skip


def dead_cache() -> dict:
    """CACHES on a port nobody listens on, as when the cache's Redis restarts."""
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{devredis.free_port()}/0",
        }
    }


@pytest.fixture
def cache_down(settings):
    settings.CACHES = dead_cache()


def test_with_the_cache_down_a_bad_file_is_refused_with_its_errors_and_kept(
    root_client, api, cache_down
):
    upload = SimpleUploadedFile("calls.csv", b"path,cost\n/a,-1\n/b,2\n")
    response = submit(root_client, api, calls_file=upload)
    # expect: the page with the file's errors, and the file kept (in the database, not the
    # cache) for the next try; nothing stored
    assert response.status_code == 200
    html = response.content.decode()
    assert "line 2: cost:" in html
    assert "Using <strong>calls.csv</strong>" in html
    assert not Job.objects.exists()


def test_with_the_cache_down_a_good_file_still_makes_its_job(root_client, api, cache_down):
    upload = SimpleUploadedFile("calls.csv", b"path\n/a\n/b\n")
    response = submit(root_client, api, calls_file=upload)
    assert response.status_code == 302
    assert Job.objects.get().total == 2


def test_with_the_cache_down_a_kept_file_is_still_there(root_client, api, settings):
    # given a file kept by a refused try, and then the cache going down
    upload = SimpleUploadedFile("calls.csv", b"path\n/a\n")
    token = submit(root_client, api, calls_file=upload, priority=0).context["form"].kept.token
    settings.CACHES = dead_cache()
    response = submit(root_client, api, kept_upload=token)
    assert response.status_code == 302
    assert Job.objects.get().total == 1
